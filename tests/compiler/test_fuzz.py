"""Differential fuzzing in CI: generated programs, compiled vs eager (``benchmarks/fuzzgen.py``).

``PROGRAMS`` seeded programs of up to ``MAX_OPS`` statements, in batches of ``BATCH``: each runs
eagerly and compiled in default mode, twice more in default mode (the second time on scaled
leaf data: program-cache hits computing on new arrays), in debug mode, for every eighth seed
with every kernel as generated code, and every tenth (smooth float64) also through
``gradcheck`` on the compiled path.  A failing batch names each failing seed and configuration
and prints the shrunk repro script of the first failure; ``python -m benchmarks.fuzz --seed S
--programs 1 --max-ops 6`` writes them all.  The long campaign is ``python -m benchmarks.fuzz
--programs 10000``.

The other tests keep the fuzzer honest: programs are deterministic, their scripts run on their
own, the comparison catches what it must and tolerates rounding it must, and the programs of
the CI seeds cover every category the generator promises.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import fusegrad as fg
from fusegrad import compiler
from fusegrad.autograd.tracer import tracing

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # ``benchmarks`` is a package at the repository root
    sys.path.insert(0, str(REPO_ROOT))

from benchmarks import fuzzgen  # noqa: E402

# The cost is numba compiling generated modules (~0.5 s each for programs of up to 6
# statements, ~1 s for 10): measured on 2 cores, the 200 programs take ~75 s with an empty
# FUSEGRAD_CACHE_DIR and ~13 s once the modules are on disk; the campaign runs longer programs
PROGRAMS = 200
BATCH = 20
MAX_OPS = 6
BATCHES = [range(start, min(start + BATCH, PROGRAMS)) for start in range(0, PROGRAMS, BATCH)]

pytestmark = pytest.mark.usefixtures("fresh_compiler")


@pytest.mark.parametrize("seeds", BATCHES, ids=[f"seeds{b.start}-{b.stop - 1}" for b in BATCHES])
def test_compiled_backward_matches_eager_on_generated_programs(seeds: range) -> None:
    findings: list[fuzzgen.Finding] = []
    programs: dict[int, fuzzgen.Program] = {}
    compiled_runs = gradchecked = step_runs = 0
    for seed in seeds:
        # every eighth program also with every kernel as generated code, every sixteenth also
        # as native segments (the campaign: every fourth each): those configurations compile
        # a module per program, the costliest part
        program = replace(
            fuzzgen.generate(seed, MAX_OPS), generated_code=seed % 8 == 3, native=seed % 16 == 5
        )
        report = fuzzgen.check(program)
        programs[seed] = program
        findings += report.findings
        compiled_runs += report.compiled_runs
        step_runs += report.step_runs
        gradchecked += report.gradcheck == "passed"
    if findings:
        first = findings[0]
        small = fuzzgen.shrink(first, programs[first.seed], budget_s=10.0)
        config = fuzzgen.CONFIGS.get(first.config, fuzzgen.Config(first.config))
        summary = "\n".join(f"  {str(f).splitlines()[0][:300]}" for f in findings)
        pytest.fail(
            f"{len(findings)} failure(s) in seeds {seeds.start}..{seeds.stop - 1}:\n{summary}\n\n"
            f"repro of seed {first.seed} [{first.config}], shrunk (all of them: python -m "
            f"benchmarks.fuzz --seed {first.seed} --programs 1 --max-ops {MAX_OPS}):\n"
            f"{small.source(config, f'{first.kind}: {first.message}')}",
            pytrace=False,
        )
    # the compiler really ran (programs did not all fall back), and gradcheck ran on the smooth
    # programs of the batch (a program whose objective overflows is skipped, not failed)
    assert compiled_runs >= len(seeds)
    # ... and the whole-step and compile(module) configurations replayed most programs (the
    # others stopped recording with a reason: hooks, retain_grad, views written in place, ...)
    assert step_runs >= len(seeds) // 2
    smooth = sum(1 for s in seeds if s % 10 == 0)
    assert gradchecked >= smooth - 1


def test_a_seed_gives_one_program() -> None:
    assert fuzzgen.generate(17).source() == fuzzgen.generate(17).source()
    assert fuzzgen.generate(17).source() != fuzzgen.generate(18).source()


def test_repro_script_runs_on_its_own(tmp_path: Path) -> None:
    program = fuzzgen.generate(4)  # a program without findings
    assert fuzzgen.check(program).ok
    path = tmp_path / "repro.py"
    path.write_text(program.source(fuzzgen.DEBUG))
    proc = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no difference" in proc.stdout


def _result(values: list[float], dtype: str = "float32") -> dict[str, fuzzgen._Array]:
    return {"x.grad": fuzzgen._Array(np.array(values, dtype=dtype), dtype)}


def test_compare_requires_equal_nan_and_inf_positions() -> None:
    eager = _result([np.nan, np.inf, 1.0])
    assert fuzzgen.compare(eager, _result([np.nan, np.inf, 1.0])) == []
    assert fuzzgen.compare(eager, _result([0.0, np.inf, 1.0]))
    assert fuzzgen.compare(eager, _result([np.nan, -np.inf, 1.0]))
    assert fuzzgen.compare(eager, _result([np.nan, np.nan, 1.0]))


def test_compare_requires_equal_dtype_shape_and_presence() -> None:
    eager = _result([1.0, 2.0])
    assert fuzzgen.compare(eager, _result([1.0, 2.0], "float64"))
    assert fuzzgen.compare(eager, _result([1.0, 2.0, 3.0]))
    assert fuzzgen.compare(eager, {"x.grad": None})
    assert fuzzgen.compare({"x.grad is preset": True}, {"x.grad is preset": False})


def test_compare_tolerates_rounding_and_not_more() -> None:
    eager = _result([1.0, 100.0], "float64")
    assert fuzzgen.compare(eager, _result([1.0 + 1e-12, 100.0], "float64")) == []
    assert fuzzgen.compare(eager, _result([1.0 + 1e-8, 100.0], "float64"))
    eager32 = _result([1.0, 100.0])
    assert fuzzgen.compare(eager32, _result([1.0 + 2e-6, 100.0])) == []
    assert fuzzgen.compare(eager32, _result([1.0 + 1e-4, 100.0]))


def test_compare_floor_follows_the_root_gradients() -> None:
    # an exact cancellation in eager (0.0) left as an FMA's rounding error by compiled code:
    # within a few roundoffs of the root gradients' scale, and not beyond
    eager = {
        **_result([0.0], "float64"),
        "C[0] after backward": _result([1.5], "float64")["x.grad"],
    }
    close = {**eager, "x.grad": _result([2.6e-17], "float64")["x.grad"]}
    far = {**eager, "x.grad": _result([1e-12], "float64")["x.grad"]}
    assert fuzzgen.compare(eager, close) == []
    assert fuzzgen.compare(eager, far)


def test_compare_scales_the_tolerance_by_the_measured_rounding_error() -> None:
    # a float32 sum that cancels: eager's pairwise float32 sum is off the float64 (shadow) value
    # by 2e-3, so a compiled result near the shadow's is within tolerance although far from
    # eager's in relative terms; without the shadow the same result is a mismatch
    eager = _result([0.002, 5.0])
    shadow = _result([0.0001, 5.0], "float64")
    compiled = _result([0.0002, 5.0])
    assert fuzzgen.compare(eager, compiled)
    assert fuzzgen.compare(eager, compiled, [shadow]) == []
    assert fuzzgen.compare(eager, _result([0.5, 5.0]), [shadow])


# what the CI seeds must exercise: (name, pattern in the forward / backward source)
COVERAGE = {
    "unary": r"\.(exp|log|tanh|sigmoid|sqrt|abs|sin|cos|erf|expm1|log1p|reciprocal|sign|floor)\(",
    "activation": r"F\.(relu|gelu|silu|softplus|elu)\(",
    "binary": r"fg\.(maximum|minimum|pow|div)\(|\*\*|fg\.where\(",
    "where with a comparison": r"fg\.where\(\w+ [<>]",
    "python scalar operand": r"= \w+ [-+*/] \d",
    "reduction with dim": r"\.(sum|mean|amax|prod|var|std)\(dim=",
    "logsumexp": r"fg\.logsumexp\(",
    "view": r"\.(reshape|view|transpose|permute|unsqueeze|squeeze|expand|narrow|select|diagonal)\(",
    "slice with step": r"\[:*, *::2\]|\[::2\]",
    "in-place on a non-leaf": r"^\w+\.(add_|mul_|clamp_|sub_|div_)\(",
    "in-place through a view": r"^\w+(\[[^\]]*\]|\.\w+\([^)]*\))+\.\w+_\(|^\w+\[.*\] = ",
    "matmul": r"@|fg\.(bmm|mm|matmul)\(|F\.linear\(",
    "softmax": r"softmax\(",
    "layer_norm": r"F\.layer_norm\(",
    "cross_entropy": r"F\.cross_entropy\(",
    "hook": r"register_hook\(lambda g: g",
    "retain_grad": r"\.retain_grad\(\)",
    "autograd.grad": r"fg\.autograd\.grad\(",
    "backward(inputs=)": r"backward\(inputs=",
    "backward twice": r"retain_graph=True",
}


def test_ci_programs_cover_every_category() -> None:
    programs = [fuzzgen.generate(seed, MAX_OPS) for seed in range(PROGRAMS)]
    sources = ["\n".join(p.forward + p.backward) for p in programs]
    for name, pattern in COVERAGE.items():
        hits = sum(1 for s in sources if re.search(pattern, s, re.MULTILINE))
        assert hits >= 3, f"{name}: {hits} programs"
    leaves = [leaf for p in programs for leaf in p.leaves]
    assert sum(1 for leaf in leaves if leaf.shape == ()) >= 10  # 0-d
    assert sum(1 for leaf in leaves if 1 in leaf.shape) >= 10  # size-1 broadcasting
    assert sum(1 for leaf in leaves if 0 in leaf.shape) >= 3  # empty
    assert sum(1 for leaf in leaves if re.search(r"\binf\b", leaf.literal)) >= 10
    assert sum(1 for leaf in leaves if re.search(r"\bnan\b", leaf.literal)) >= 5
    precisions = {p.precision for p in programs}
    assert precisions == {"float32", "float64", "mixed"}
    assert sum(1 for p in programs if p.presets) >= 5  # accumulation into an existing .grad
    assert all(p.gradcheck == (p.seed % 10 == 0) for p in programs)
    assert all(p.precision == "float64" for p in programs if p.gradcheck)


def test_compare_gives_float32_rounding_to_float64_results_that_carry_it() -> None:
    # seed 2301: a float64 leaf's gradient is a float32 sum cast up; eager happened to be 8e-9
    # off the float64 shadow, compiled (another float32 summation order) 4e-8: both float32
    # rounding.  A float64 result the float32 values do not reach keeps float64's tolerance.
    eager = _result([2.17706499], "float64")
    compiled = _result([2.17706499 - 4.5e-8], "float64")
    carries = _result([2.17706499 + 8e-9], "float64")
    untouched = _result([2.17706499], "float64")
    assert fuzzgen.compare(eager, compiled, [carries]) == []
    assert fuzzgen.compare(eager, compiled, [untouched])
    assert fuzzgen.compare(eager, _result([2.17706499 - 1e-6], "float64"), [carries])


def test_compare_floor_follows_the_terms_flowing_into_a_result() -> None:
    # seed 3195: eager cancels g*40 - g*40 to 0; an FMA leaves the rounding error of one product
    # of ~1.3e5 (-2**-7); the result and the root gradients are small
    eager = _result([0.0, 1.0])
    got = _result([-(2.0**-7), 1.0])
    assert fuzzgen.compare(eager, got)
    assert fuzzgen.compare(eager, got, term_scales={"x.grad": 1.3e5}) == []
    assert fuzzgen.compare(eager, _result([-1.0, 1.0]), term_scales={"x.grad": 1.3e5})


def test_term_scales_observes_the_largest_gradient_flowing_into_each_grad() -> None:
    big = fg.tensor(1e30, requires_grad=False)
    x = fg.tensor(-0.1647, requires_grad=True)
    y = fg.tensor(2.0, requires_grad=True)
    observer = fuzzgen._TermScales()
    with tracing(observer):
        ((big - x) * (big + x) * 0.5 + y * 3.0).backward()
    assert x.grad is not None and y.grad is not None
    scales = observer.by_key({"x.grad": x.grad, "y.grad": y.grad})
    assert scales["x.grad"] >= 0.5e30  # g * (big + x), before the two terms cancel
    assert scales["y.grad"] == 3.0  # the terms into y only, not x's
    assert float(x.grad.numpy()) == 0.0  # observing leaves eager's values alone


def test_a_configuration_over_two_scales_is_compared_with_eager_over_the_same_scales() -> None:
    """Seed 20637 raises at the first scale of the leaf data (an in-place clamp of a saved
    output: eager's backward raises) and at the second in the forward (a boolean mask keeps
    other sizes).  The cached configurations run the scales in turn and stop at the first
    error; eager, the reference, does the same: no finding, in the checker or its script."""
    program = fuzzgen.generate(20637)
    report = fuzzgen.check(program)
    assert report.ok, [f.verdict for f in report.findings]
    assert "eager = attempt(scales=(1.0, 0.75))" in program.source(fuzzgen.CACHED, "")


def test_every_fourth_program_also_runs_as_native_segments() -> None:
    """Seeds 1 mod 4 add the whole step built with native segments (``native_programs``), and
    the repro script of that configuration sets it."""
    assert {fuzzgen.NATIVE, fuzzgen.NATIVE_MODULE, fuzzgen.NATIVE_BACKWARD} <= set(
        fuzzgen.generate(5).configs()
    )
    assert fuzzgen.NATIVE not in fuzzgen.generate(6).configs()
    assert fuzzgen.NATIVE_MODULE not in fuzzgen.generate(6).configs()
    program = fuzzgen.generate(5)
    assert "compiler.config.native_programs = True" in program.source(fuzzgen.NATIVE, "")
    assert "compiler.config.native_programs = True" in program.source(fuzzgen.NATIVE_BACKWARD, "")
    assert "native_programs" not in program.source(fuzzgen.WHOLE, "")
    assert "native_programs" not in program.source(fuzzgen.DEFAULT, "")
    before = compiler.config.native_programs
    report = fuzzgen.check(program)
    assert report.ok, [f.verdict for f in report.findings]
    assert compiler.config.native_programs == before  # (restored after the configuration)


def test_only_runs_the_named_configurations_and_counts_native_segment_calls(monkeypatch) -> None:
    """``check(program, only)`` (``python -m benchmarks.fuzz --only native``) runs just those
    configurations, a native one whether or not the seed draws it, and the report counts the
    native segment calls that ran (``compiler.counters.native_runs``): a campaign of the native
    runtime can show that native code ran."""
    ran: list[str] = []
    run_config = fuzzgen._run_config

    def recording(program, module, config, *rest):  # type: ignore[no-untyped-def]
        ran.append(config.name)
        return run_config(program, module, config, *rest)

    monkeypatch.setattr(fuzzgen, "_run_config", recording)
    program = fuzzgen.generate(200000)  # (a whole step of 2 segment steps; seed 0 mod 4)
    assert fuzzgen.NATIVE not in program.configs()
    report = fuzzgen.check(program, [fuzzgen.NATIVE])
    assert report.ok, [f.verdict for f in report.findings]
    assert ran == [fuzzgen.NATIVE.name]
    assert report.native_runs >= 1 and report.native_steps >= 2 * report.native_runs
    assert not report.native_dropped
    smooth = next(s for s in range(0, 200, 10) if fuzzgen.generate(s, MAX_OPS).gradcheck)
    report = fuzzgen.check(fuzzgen.generate(smooth, MAX_OPS), [fuzzgen.DEFAULT])
    assert report.gradcheck == "n/a"  # (not among the configurations asked for)


def test_only_rejects_unknown_configuration_names() -> None:
    from benchmarks import fuzz

    assert fuzz.parse_args(["--only", "native,debug"]).only == ["native", "debug"]
    assert fuzz.parse_args(["--only", "native-module"]).only == ["native-module"]
    with pytest.raises(SystemExit):
        fuzz.parse_args(["--only", "nativ"])


def test_gradcheck_of_the_campaign_compiles_in_the_foreground(monkeypatch) -> None:
    """gradcheck runs its backward several times and wants the same values each time (its
    reentrancy check is exact): with a background compile, the first calls ran uncompiled and
    the later ones compiled, rounding differently, and a campaign reported "not reentrant" for
    a program whose repro script (foreground) passed."""
    seen: list[bool] = []
    gradcheck = fg.autograd.gradcheck

    def spy(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(compiler.config.background_compile)
        return gradcheck(*args, **kwargs)

    monkeypatch.setattr(fg.autograd, "gradcheck", spy)
    monkeypatch.setattr(compiler.config, "background_compile", True)
    smooth = next(s for s in range(0, 200, 10) if fuzzgen.generate(s, MAX_OPS).gradcheck)
    report = fuzzgen.check(fuzzgen.generate(smooth, MAX_OPS), [fuzzgen.GRADCHECK])
    assert report.gradcheck == "passed", report.findings
    assert seen and seen[0] is False
    assert compiler.config.background_compile is True  # (restored)


def test_compare_allows_eagers_own_change_under_one_ulp_of_the_root_gradients() -> None:
    # seed 1006449: eager's 0 is an exact cancellation for about half of the roundings; moving
    # the root gradients by one ulp gives the other half, 8.4e-15 -- the compiled value
    eager = _result([0.0, 1.0], "float64")
    got = _result([-8.4e-15, 1.0], "float64")
    moved = _result([8.4e-15, 1.0 + 2.0**-52], "float64")
    unmoved = _result([0.0, 1.0], "float64")
    assert fuzzgen.compare(eager, got)
    assert fuzzgen.compare(eager, got, perturbed=[unmoved, moved]) == []
    # the allowance is a few times the change measured, no more
    assert fuzzgen.compare(eager, _result([-1e-13, 1.0], "float64"), perturbed=[moved])
    # a perturbed run that overflows tells nothing about rounding: |eager| (as a shadow's)
    assert fuzzgen.compare(eager, _result([0.0, 1.5], "float64"), perturbed=[moved])
    overflow = _result([8.4e-15, np.inf], "float64")
    assert fuzzgen.compare(eager, _result([0.0, 1.5], "float64"), perturbed=[overflow]) == []


def test_moved_roots_moves_each_root_gradient_by_one_ulp_of_its_dtype() -> None:
    program = fuzzgen.generate(1006449)
    module = fuzzgen._Module(program)
    outs = [fg.zeros(2, dtype=fg.float32), fg.zeros(2, dtype=fg.float64)]
    module.ns["COTANGENTS"] = [np.array([0.1, 0.0]), np.array([-3.0, np.inf])]
    plain = module.ns["roots"](outs)
    with module.moved_roots(np.random.default_rng(0)):
        moved = module.ns["roots"](outs)
    assert [t.dtype for t in moved] == [t.dtype for t in plain]
    for a, b in zip(plain, moved):
        a, b = a.numpy(), b.numpy()
        nonzero = np.isfinite(a) & (a != 0)
        step = np.abs(np.nextafter(a[nonzero], np.inf, dtype=a.dtype) - a[nonzero])
        np.testing.assert_array_equal(np.abs(b[nonzero] - a[nonzero]), step)
        np.testing.assert_array_equal(b[~nonzero], a[~nonzero])  # (zeros and inf kept)
    assert module.ns["roots"](outs)[0].numpy()[0] == np.float32(0.1)  # (restored)


def test_a_deviation_beyond_eagers_rounding_is_still_reported_where_eager_is_unstable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seed 1006449 as native segments: a layer norm over 2 elements of ~1e29 and ~1, whose
    gradient is then multiplied by a weight of 7.5e29.  The exact v3.grad[0, 2] is 2.7e-61
    (mpmath); eager's is 0 for about half of the roundings of the root gradients, +-8.4e-15
    for the others.  Compiled gave -8.4e-15 when the campaign found it (another build of the
    program rounds to 1.8e-15), beyond the floor of 4.3e-15.  Here the compiled value is set:
    eager's own value one ulp of the root gradients away passes, and fails without the
    perturbed runs; a value 12 times further off is still a mismatch."""
    program = fuzzgen.generate(1006449)
    assert fuzzgen.check(program, [fuzzgen.NATIVE]).ok
    verdict = fuzzgen._verdict
    compiled_value = [0.0]

    def setting(eager, got, *rest):  # type: ignore[no-untyped-def]
        if isinstance(got, dict) and "v3.grad" in got:
            values = got["v3.grad"].values.copy()
            values[0, 2] = compiled_value[0]
            got = {**got, "v3.grad": fuzzgen._Array(values, got["v3.grad"].dtype)}
        return verdict(eager, got, *rest)

    monkeypatch.setattr(fuzzgen, "_verdict", setting)
    compiled_value[0] = -8.407790785948903e-15  # (eager's, roots moved by one ulp)
    assert fuzzgen.check(program, [fuzzgen.NATIVE]).ok
    compiled_value[0] = -1e-13
    report = fuzzgen.check(program, [fuzzgen.NATIVE])
    assert [f.kind for f in report.findings] == ["mismatch"]
    message = report.findings[0].message
    assert "v3.grad: 1 of 4 elements beyond tolerance; worst at (0, 2)" in message
    monkeypatch.setattr(fuzzgen, "PERTURBED_RUNS", 0)  # (the checker before them)
    monkeypatch.setattr(fuzzgen, "JITTERED_RUNS", 0)
    monkeypatch.setattr(fuzzgen, "FORWARD_JITTERED_RUNS", 0)  # (they jitter the backward too)
    compiled_value[0] = -8.407790785948903e-15
    assert not fuzzgen.check(program, [fuzzgen.NATIVE]).ok


def test_jitter_moves_only_the_cancellations_inside_a_backward() -> None:
    """``_Jitter``: each node's result moves by a measured sample of its rounding error where
    that is beyond a few roundoffs of the result -- a cancellation (log_softmax's backward at
    a class of probability 1 - 4e-16: terms of 1 cancel to 4e-16) -- and not where its rounding
    is its own: the other class's gradient, a scaling by 1e-30, probabilities of 0.5, a
    constant gradient."""

    def run(jitter: bool, logits: list, scale: float = 1.0) -> np.ndarray:
        x = fg.tensor(logits, dtype=fg.float64, requires_grad=True)
        tracer = fuzzgen._Jitter(np.random.default_rng(1)) if jitter else None
        with tracing(tracer):
            z = (x * scale).square()
            loss = fg.nn.functional.cross_entropy(z, fg.tensor([1]), reduction="sum")
            loss.backward()
        return x.grad.numpy()

    cancelling = [[6.0, 8.4558]]
    plain = run(False, cancelling)
    change = np.abs(run(True, cancelling) - plain)
    # the target's gradient, p - 1, cancels; the other's, p, is a product (its own rounding)
    assert change[0, 1] > 1e-17 and change[0, 0] == 0, (plain, change)
    for logits, scale in (([[1.0, -1.0]], 1.0), ([[1e30, -1e30]], 1e-30)):
        np.testing.assert_array_equal(run(True, logits, scale), run(False, logits, scale))
    # a constant gradient stays constant
    x = fg.tensor(np.random.default_rng(2).standard_normal((3, 4)), requires_grad=True)
    with tracing(fuzzgen._Jitter(np.random.default_rng(3))):
        ((x * 3.0).sum() * 0.1).backward()
    np.testing.assert_array_equal(x.grad.numpy(), np.full((3, 4), 0.1 * 3.0))


def test_compare_allows_a_cancellations_rounding_that_later_nodes_amplify() -> None:
    """Fuzz seed 301685 as native segments: cross entropy of the squares of variances, its
    target's probability 1 - 3.8e-16, so log_softmax's backward cancels terms of 0.555 to
    2.2e-16 (eager) or 2.5e-16 (compiled: one FMA), which pow and var then multiply by 51.
    Both are within a roundoff of the terms of the exact value; the floor (a few roundoffs of
    the terms where the gradient is written) was 2.5e-16 against a difference of 1.2e-15.
    The jittered runs measure the amplification; without them the campaign reported it."""
    program = fuzzgen.generate(301685)
    assert fuzzgen.check(program, [fuzzgen.NATIVE]).ok
    saved = fuzzgen.JITTERED_RUNS, fuzzgen.FORWARD_JITTERED_RUNS
    try:
        # (the checker before them; the forward-jittered runs jitter the backward too)
        fuzzgen.JITTERED_RUNS = fuzzgen.FORWARD_JITTERED_RUNS = 0
        report = fuzzgen.check(program, [fuzzgen.NATIVE])
    finally:
        fuzzgen.JITTERED_RUNS, fuzzgen.FORWARD_JITTERED_RUNS = saved
    assert [f.kind for f in report.findings] == ["mismatch"], report.findings


def test_forward_jitter_moves_each_rounded_forward_value_by_one_ulp() -> None:
    """``_Jitter(rng, forward=True)``: every element a forward primitive rounded moves by one
    ulp, up or down as its value says (equal values alike: a tie stays a tie); exact elements
    (a floor, a maximum, a product by 2, a cast), zeros and infinities stay; the backward's
    rules compute on the moved values but their own results do not move."""

    def run(jitter: bool) -> list[np.ndarray]:
        x = fg.tensor([0.3, 1.5, 0.0, -np.inf, 0.3], dtype=fg.float32, requires_grad=True)
        tracer = fuzzgen._Jitter(np.random.default_rng(5), forward=True) if jitter else None
        with tracing(tracer):
            e = x.exp()
            twice = x * 2.0
            peak = fg.maximum(x.exp(), e)  # (a tie of two computations of one value)
            floor = (x * 4.0).floor()
            wide = x.to(fg.float64)
            (e * twice).sum().backward()
        return [t.detach().numpy() for t in (e, twice, peak, floor, wide, x.grad)]

    plain, moved = run(False), run(True)
    e, e_moved = plain[0], moved[0]
    rounded = np.array([True, True, False, False, True])  # (exp(0) = 1 and exp(-inf) = 0)
    ulps = np.abs(e_moved[rounded] - e[rounded]) / np.spacing(e[rounded])
    np.testing.assert_array_equal(ulps, 1.0)
    assert e_moved[0] == e_moved[4]  # (equal values move alike)
    np.testing.assert_array_equal(e_moved[~rounded], e[~rounded])
    for exact, exact_moved in zip(plain[3:5], moved[3:5]):  # the floor and the cast
        np.testing.assert_array_equal(exact_moved, exact)
    np.testing.assert_array_equal(moved[1], plain[1])  # (x * 2 is exact)
    np.testing.assert_array_equal(moved[2], e_moved)  # (the tie stays a tie)
    # x.grad = twice e + 2 e from the moved e; the rules' own results are not moved
    x = np.array([0.3, 1.5, 0.0, 0.3], dtype=np.float32)
    finite = np.array([0, 1, 2, 4])
    want = e_moved[finite] * (x * np.float32(2.0)) + e_moved[finite] * np.float32(2.0)
    np.testing.assert_array_equal(moved[5][finite], want)
    assert (moved[5][finite] != plain[5][finite]).any()
    # a layer norm over one element is exactly 0 (its mean is exact): the norm kernels compute
    # their statistics in float64 whatever the input, so that which of the float64 ones are
    # exact is unknown, and they stay (moved, the zeros became unequal: fuzz seed 303090)
    for dtype in (fg.float32, fg.float64):
        x = fg.tensor([[5.457877846075395], [2.4717517717246213]], dtype=dtype)
        with tracing(fuzzgen._Jitter(np.random.default_rng(5), forward=True)):
            normed = fg.nn.functional.layer_norm(x.requires_grad_(), (1,))
        np.testing.assert_array_equal(normed.detach().numpy(), 0.0)


def test_compare_allows_the_rounding_of_a_compiled_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fuzz seed 302916 as a whole step: v5 = l1_loss(x4, x6) = 4.517175, v9 = exp(v5),
    grad(v5) = 0.255 v9 cos(2 v9) + a small term through tanh.  numpy's float32 exp(4.517175)
    is 91.57653, 2.1 ulp below the correctly rounded 91.576546 of the compiled step, and one ulp
    of v9 (7.6e-6) is 2.9e-4 of grad(v5): eager 13.759516, compiled 13.758944 when the campaign
    found it (exact from the float32 leaves: 13.759525 -- eager's exp error cancels the rounding
    of v5).  The tolerance was 4.4e-4: the shadow estimate is eager's actual error, small by
    that luck.  The forward-jittered runs measure what a forward rounded otherwise does; here the
    compiled value is set to eager's minus the campaign's difference: it passes, and failed
    without them; a value 1% off is still a mismatch."""
    program = fuzzgen.generate(302916)
    assert fuzzgen.check(program, [fuzzgen.WHOLE]).ok
    verdict = fuzzgen._verdict
    off = [0.0, 0.0]  # (absolute, relative) change of eager's grad(v5)

    def setting(eager, got, *rest):  # type: ignore[no-untyped-def]
        if isinstance(got, dict) and "grad(v5)" in got:
            want = eager["grad(v5)"].values
            values = (want - off[0] - off[1] * want).astype(want.dtype)
            got = {**got, "grad(v5)": fuzzgen._Array(values, got["grad(v5)"].dtype)}
        return verdict(eager, got, *rest)

    monkeypatch.setattr(fuzzgen, "_verdict", setting)
    off[:] = [0.000572, 0.0]
    assert fuzzgen.check(program, [fuzzgen.WHOLE]).ok
    # the configurations that run the forward eagerly are not granted the forward's rounding
    assert not fuzzgen.check(program, [fuzzgen.CACHED]).ok  # (the same scales)
    off[:] = [0.0, 0.01]
    report = fuzzgen.check(program, [fuzzgen.WHOLE])
    assert [f.kind for f in report.findings] == ["mismatch"]
    assert "grad(v5): 1 of 1 elements beyond tolerance" in report.findings[0].message
    monkeypatch.setattr(fuzzgen, "FORWARD_JITTERED_RUNS", 0)  # (the checker before them)
    off[:] = [0.000572, 0.0]
    # (where numpy's float32 exp is correctly rounded, eager's grad(v5) is 13.758944 and the
    # float64 shadow's estimate alone, 6.5e-4, grants the difference: the campaign's numpy's
    # SIMD exp is 2.1 ulp low there)
    if np.exp(np.array([4.517175], dtype=np.float32))[0] == np.float32(91.57653):
        assert not fuzzgen.check(program, [fuzzgen.WHOLE]).ok


def test_a_chunked_campaign_adds_up_to_the_campaign_in_one_process(tmp_path: Path) -> None:
    """``--chunk``: a campaign run as child processes of a few programs each (numba never frees
    what it compiled, so one process grows with every program) gives the totals of the same
    campaign in one process, and its JSON holds them."""
    import json
    import subprocess
    import sys

    from benchmarks import fuzz

    # (each in a process of its own: a campaign pins numba's threads, which a test process
    # must keep)
    common = [sys.executable, "-m", "benchmarks.fuzz", "--seed", "5000", "--programs", "3"]
    common += ["--only", "quick,default", "--out", str(tmp_path / "repros")]
    root = Path(fuzz.__file__).resolve().parents[1]
    for chunk, name in (("2", "chunked"), ("0", "whole")):
        command = [*common, "--chunk", chunk, "--json", str(tmp_path / f"{name}.json")]
        done = subprocess.run(command, cwd=root, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    chunked = json.loads((tmp_path / "chunked.json").read_text())["totals"]
    whole = json.loads((tmp_path / "whole.json").read_text())["totals"]
    assert chunked["programs"] == 3 and chunked["first_seed"] == 5000
    for key in (*fuzz._SUMMED, *fuzz._COUNTED, *fuzz._LISTED, "classes", "only", "max_ops"):
        assert chunked[key] == whole[key], key
    assert chunked["cache_hit_rate"] == pytest.approx(whole["cache_hit_rate"])
