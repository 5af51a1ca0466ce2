"""Pictures of compiled programs: the DOT graph behind ``explain(...).to_dot()`` /
``.render(path)`` and the pictures of the trace report (``trace``).

Where it sits: after ``program.Program`` is built, it reads the program's IR graph and the
schedule of its default variant (the capture's sizes: ``Program.default.schedule``) and draws,
with ``fusegrad.viz.DotGraph``:

* one node per IR value computed (``%id op``, dtype and shape, sizes as ``sN`` for symbolic
  graphs); Python scalars a value reads are written in its label instead of drawn;
* the program's inputs (root gradients, saved tensors, existing ``.grad``\\ s, a whole step's
  arguments, parameters, random draws and runtime scalars) and constants;
* each fused kernel as a cluster (``cluster_<program>_k<step>``) around the values fused into it,
  labelled with its iteration space and how it runs (generated code or the interpreter);
  reductions fused as epilogues are marked, and so are ``.grad`` effects whose ``+=`` the kernel
  does itself (the accumulation epilogue), drawn inside the kernel;
* externs (a primitive's eager kernel, a fusion barrier) as bold boxes; user hooks and ordered
  ``.grad`` writes (``hook``, ``hook_output``, ``store_grad``, ``unpack_saved``: opaque steps at
  their eager positions) as red octagons;
* the effects: ``.grad`` accumulation, ``backward(inputs=...)`` gradients, returned values,
  in-place writes of a whole step;
* for a whole-step program, each value coloured by the part of the step it belongs to:
  *backward* (made by a derivative rule: its ``origin`` names the node), *optimizer* (no rule,
  computed from a gradient, and leading to an in-place write), *forward* (the rest).  Fusion may
  put values of two parts in one kernel (a forward ``tanh`` and its backward), so the parts are
  colours, not clusters; a legend says which is which;
* for a report, fallbacks and steps that could not be replayed, as notes with their reasons.

Walks are loops over the graph's values (already in topological order); nothing recurses.
"""

from __future__ import annotations

import textwrap
from typing import Any

from fusegrad.viz import DotGraph

from .ir import IR_OPS, Graph, Value
from .passes.fuse import Extern, Kernel
from .symbolic import format_expr

__all__ = ["PHASE_COLORS", "phases", "program_dot", "report_dot"]

PHASE_COLORS = {"forward": "#dbe8ff", "backward": "#ffe2c6", "optimizer": "#d9f5d3"}
INPUT_COLOR = "lightblue"
EFFECT_COLOR = "darkolivegreen1"
HOOK_COLOR = "#ffc9c9"
NOTE_COLOR = "mistyrose"
_OPAQUE = ("hook", "hook_output", "store_grad", "unpack_saved", "function", "function_output")


def _wrap(text: str, width: int = 64) -> str:
    return "\n".join(textwrap.wrap(text, width)) or text


def _dims(shape: tuple) -> str:
    return "[" + ", ".join(format_expr(d) for d in shape) + "]"


def phases(graph: Graph) -> dict[Value, str]:
    """The part of a whole step each computed value belongs to (see the module docstring)."""
    uses_grad: set[Value] = set()  # depends on a value a derivative rule made
    for v in graph.values:
        if v.origin or any(i in uses_grad for i in v.inputs):
            uses_grad.add(v)
    feeds_write: set[Value] = {v for kind, _, v in graph.effects if kind == "write"}
    for v in reversed(graph.values):
        if v in feeds_write:
            feeds_write.update(v.inputs)
    out: dict[Value, str] = {}
    for v in graph.values:
        if v.op in IR_OPS:
            continue
        if v.origin:
            out[v] = "backward"
        elif v in uses_grad:
            out[v] = "optimizer" if v in feeds_write else "backward"
        else:
            out[v] = "forward"
    return out


def _input_label(v: Value, sources: list | None) -> str:
    kind, index = v.attr("kind"), v.attr("index")
    if kind == "arg" and sources is not None and index < len(sources):
        what = {
            "arg": "argument",
            "ext": "parameter / buffer",
            "draw": "random draw",
            "scalar": "runtime scalar",
            "cast": "runtime scalar, cast",
            "grad": "existing .grad",
        }.get(sources[index][0], sources[index][0])
        return f"%{v.id} input {index}: {what}"
    names = {"root": "root gradient", "saved": "saved tensor", "grad": "existing .grad"}
    return f"%{v.id} {names.get(kind, kind)} {index}"


def _effect_label(kind: str, slot: Any, whole_step: bool) -> str:
    if kind == "grad":
        return f".grad of leaf {slot}"
    if kind == "input_grad":
        return f".grad of inputs[{slot}]"
    if kind == "write":
        return f"in-place write to input {slot}"
    if kind == "check":
        return f"NaN check: node {slot[0]}, output {slot[1]}"
    return f"output {slot}" if whole_step else f"returned gradient {slot}"


def _value_label(v: Value, extra: str = "") -> str:
    scalars = [repr(i.attr("value")) for i in v.inputs if i.op == "scalar"]
    lines = [f"%{v.id} {v.op}" + (f" ({extra})" if extra else ""), v.dtype.name + _dims(v.shape)]
    if scalars:
        lines.append("scalars: " + ", ".join(scalars))
    if v.op == "hook":
        node, kind, slot, position = v.attr("site")
        lines.append(
            f"{kind} hook {position} of node {node}" + (f", slot {slot}" * (kind != "post_acc"))
        )
    if v.op == "unpack_saved":
        lines.append(f"unpack hook of saved tensor {v.attr('saved')}")
    if v.op == "function":
        lines.append(f"eager backward of custom Function node {v.attr('node')}")
    if v.op == "store_grad":
        target = v.attr("target")
        if target[0] == "grad":
            lines.append(f"writes .grad of leaf {target[1]}")
        elif target[0] == "input_grad":
            lines.append(f"writes .grad of inputs[{target[1]}]")
        else:
            lines.append(f"retain_grad of node {target[1]}, output {target[2]}")
    if v.origin:
        lines.append(v.origin)
    return "\n".join(lines)


def program_dot(
    program: Any,
    into: DotGraph | None = None,
    prefix: str = "p",
    title: str = "",
    sources: list | None = None,
    whole_step: bool = False,
) -> DotGraph:
    """Draw ``program`` (a ``Program``) into ``into`` (a new graph when None) as a cluster named
    ``cluster_<prefix>``; ``sources`` are a whole step's input kinds (``Step.sources``) and
    ``whole_step`` colours values by part.  Returns the graph drawn into."""
    dot = into if into is not None else _new_graph("")
    schedule = program.default.schedule
    graph: Graph = program.graph
    part = phases(graph) if whole_step else {}
    kernels = len(schedule.kernels)
    label = title or f"program: {kernels} kernel(s), {len(schedule.externs)} extern call(s)"
    box = dot.subgraph(f"cluster_{prefix}", label, style="rounded", color="gray40")
    name = {v: f"{prefix}_v{v.id}" for v in graph.values}
    drawn: set[Value] = set()
    for v in graph.values:  # inputs and constants: outside every kernel
        if v.op == "input":
            box.node(name[v], _input_label(v, sources), shape="ellipse", fillcolor=INPUT_COLOR)
            drawn.add(v)
        elif v.op == "constant":
            box.node(name[v], f"%{v.id} constant\n{v.dtype.name}{_dims(v.shape)}", shape="note")
            drawn.add(v)
    epilogue = schedule.epilogue  # output value -> leaf whose .grad the kernel adds into
    effect_names: dict[int, tuple[DotGraph, str]] = {}
    for k, step in enumerate(schedule.steps):
        if isinstance(step, Kernel):
            how = "interpreted" if k in schedule.interpreted else "generated code"
            members = step.values + step.reductions
            spans = [p for p in PHASE_COLORS if any(part.get(m) == p for m in members)]
            kernel_label = f"kernel {k} over {_dims(step.shape)} ({how})"
            if spans:
                kernel_label += "\n" + " + ".join(spans)
            cluster = box.subgraph(
                f"cluster_{prefix}_k{k}", kernel_label, style="rounded,filled", fillcolor="#f4f4f4"
            )
            for m in members:
                extra = "fused reduction" if m in step.reductions else ""
                fill = PHASE_COLORS.get(part.get(m, ""), "white")
                cluster.node(name[m], _value_label(m, extra), fillcolor=fill)
                drawn.add(m)
            for e, (kind, slot, v) in enumerate(graph.effects):
                if v in epilogue and v in members and kind == "grad":
                    effect = f"{prefix}_e{e}"
                    cluster.node(
                        effect,
                        _effect_label(kind, slot, whole_step) + "\n+= in the kernel (epilogue)",
                        shape="cds",
                        fillcolor=EFFECT_COLOR,
                    )
                    effect_names[e] = (cluster, effect)
        elif isinstance(step, Extern):
            v = step.value
            if v.op in _OPAQUE:
                box.node(
                    name[v], _value_label(v, "opaque step"), shape="octagon", fillcolor=HOOK_COLOR
                )
            else:
                fill = PHASE_COLORS.get(part.get(v, ""), "white")
                box.node(name[v], _value_label(v, "extern"), style="filled,bold", fillcolor=fill)
            drawn.add(v)
    for v in graph.values:  # edges between drawn values (scalars are in their users' labels)
        if v not in drawn:
            continue
        for i in v.inputs:
            if i in drawn:
                box.edge(name[i], name[v])
    for e, (kind, slot, v) in enumerate(graph.effects):
        if e not in effect_names:
            effect = f"{prefix}_e{e}"
            box.node(
                effect, _effect_label(kind, slot, whole_step), shape="cds", fillcolor=EFFECT_COLOR
            )
        else:
            effect = effect_names[e][1]
        if v in drawn:
            box.edge(name[v], effect, style="bold")
        else:  # a scalar, returned as is
            box.node(f"{prefix}_v{v.id}", _value_label(v), shape="plain")
            box.edge(f"{prefix}_v{v.id}", effect, style="bold")
    if whole_step:
        legend = box.subgraph(f"cluster_{prefix}_legend", "parts of the step", style="dashed")
        for phase, color in PHASE_COLORS.items():
            legend.node(f"{prefix}_legend_{phase}", phase, fillcolor=color)
    return dot


def _new_graph(title: str) -> DotGraph:
    return DotGraph(
        "program",
        graph_attrs={"rankdir": "TB", "label": title, "labelloc": "t", "fontsize": "12"},
        node_attrs={
            "shape": "box",
            "style": "filled",
            "fillcolor": "white",
            "fontsize": "10",
            "fontname": "monospace",
        },
    )


def report_dot(report: Any) -> DotGraph:
    """The picture of an ``explain`` report (``compiler.Report``): the whole-step program, every
    backward graph captured, and notes for fallbacks and steps that could not be replayed."""
    n_steps, n_graphs = len(report.steps), len(report.captures)
    title = (
        f"explain(): {n_steps} whole-step program(s), {n_graphs} captured backward graph(s), "
        f"{len(report.fallbacks)} fallback(s)"
    )
    dot = _new_graph(title)
    for k, (step, program) in enumerate(report.steps):
        if program is None:
            continue
        st = step.stats
        label = (
            f"whole step {k}: {st['forward ops']} forward op(s), {st['backward ops']} backward "
            f"op(s); {len(program.kernels)} kernel(s), {len(program.externs)} extern call(s)"
        )
        program_dot(program, dot, f"step{k}", label, sources=step.sources, whole_step=True)
    for k, (reason, program) in enumerate(report.captures):
        label = (
            f"backward graph {k}: {len(program.kernels)} kernel(s), "
            f"{len(program.externs)} extern call(s)\n{_wrap(reason)}"
        )
        program_dot(program, dot, f"graph{k}", label)
    notes = [("whole step not replayable", r) for r in report.breaks]
    notes += [("fallback (ran eagerly)", r) for r in report.fallbacks]
    for k, (what, reason) in enumerate(notes):
        dot.node(f"note{k}", f"{what}:\n{_wrap(reason)}", shape="note", fillcolor=NOTE_COLOR)
    return dot
