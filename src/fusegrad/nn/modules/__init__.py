"""``fusegrad.nn.modules``: the layers at PyTorch's module paths (``fusegrad.nn.modules.conv.
Conv2d``, ``fusegrad.nn.modules.batchnorm._BatchNorm``, ...), for code that imports them from
there, and the paths pickles of whole models name: each class's ``__module__`` is set here, once,
to its PyTorch file's module (a class's pickle names ``__module__`` and ``__qualname__``, and
those modules re-export it, so ``save(model)`` / ``load(path, weights_only=False)`` round-trips
through them).  The classes themselves live where fusegrad defines them (``nn/layers.py``,
...); nothing else about them changes.
"""

from __future__ import annotations

from . import (
    activation,
    adaptive,
    batchnorm,
    channelshuffle,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    lazy,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)
from .activation import *  # noqa: F401,F403
from .adaptive import *  # noqa: F401,F403
from .batchnorm import *  # noqa: F401,F403
from .channelshuffle import *  # noqa: F401,F403
from .container import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .distance import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .flatten import *  # noqa: F401,F403
from .fold import *  # noqa: F401,F403
from .instancenorm import *  # noqa: F401,F403
from .lazy import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .loss import *  # noqa: F401,F403
from .module import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .padding import *  # noqa: F401,F403
from .pixelshuffle import *  # noqa: F401,F403
from .pooling import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .sparse import *  # noqa: F401,F403
from .transformer import *  # noqa: F401,F403
from .upsampling import *  # noqa: F401,F403

_FILES = (
    activation,
    adaptive,
    batchnorm,
    channelshuffle,
    container,
    conv,
    distance,
    dropout,
    flatten,
    fold,
    instancenorm,
    lazy,
    linear,
    loss,
    module,
    normalization,
    padding,
    pixelshuffle,
    pooling,
    rnn,
    sparse,
    transformer,
    upsampling,
)

for _file in _FILES:
    for _name in dir(_file):
        _cls = getattr(_file, _name)
        if isinstance(_cls, type) and _cls.__module__.startswith("fusegrad.nn."):
            _cls.__module__ = _file.__name__
