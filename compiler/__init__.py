"""``fusegrad.compiler``: compiled autograd (capture backward as IR, fuse, numba codegen).

Not implemented yet (see the compiled-autograd issue).  ``src/fusegrad`` never imports this
package at load time; the engine exposes ``fusegrad.autograd._backward_runner`` and the op
registry exposes ``set_interceptor`` as the two hooks the compiler will use.
"""
