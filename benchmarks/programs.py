"""Training steps shaped like real PyTorch programs: fusegrad eager, fusegrad eager with every
backward compiled (the step inside ``compiled_autograd()``: a script's one-line change),
fusegrad ``compile(model)`` (each model compiled, the step's Python and optimizers eager),
fusegrad ``compile(step)`` (the whole step function compiled), PyTorch eager and
``torch.compile`` (each model compiled).

Each workload is written once against the PyTorch API and built for both frameworks, after the
program it is named for (sizes as in those programs unless said; ``--quick`` shrinks them):

* ``LSTM-LM``: pytorch/examples' word language model: embedding, 2 LSTM layers of 200, a
  linear decoder over a 2,000-word vocabulary, sequence 35, batch 20, truncated backpropagation
  through time (the hidden state carried from step to step, detached), ``clip_grad_norm_(0.25)``
  and SGD (lr 20);
* ``DCGAN``: pytorch/examples' DCGAN at 32x32 (a ConvTranspose2d + BatchNorm2d generator, a
  Conv2d + LeakyReLU discriminator, 32 feature maps, batch 16): one discriminator update on a
  real and a generated batch, one generator update, binary cross entropy, two Adams;
* ``Transformer``: an ``nn.Transformer`` encoder-decoder (width 64, 4 heads, 2+2 layers,
  feed-forward 128, dropout 0.1) with token embeddings (vocabulary 500), a causal target mask
  and key-padding masks, batch 16, sequences of 20, cross entropy ignoring padding, Adam;
* ``VAE``: pytorch/examples' VAE (784-400-20, reparameterised sampling), binary cross entropy
  plus KL divergence, batch 128, Adam;
* ``MNIST-CNN``: pytorch/examples' MNIST network (two 3x3 convolutions, max pooling, dropout, two
  linear layers, log-softmax), NLL loss, Adadelta (lr 1.0), batch 64;
* ``GPT``: ``benchmarks.models``' 2-layer GPT (width 64, 4 heads, block 32, vocabulary 65,
  dropout 0.1), batch 8, AdamW.

Every implementation runs the same batches from the same initial parameters; fusegrad's keep
their own random-generator state (restored around each step, outside the timing), so their
dropout masks and samples agree, and their parameters after the run are compared with
fusegrad eager's.  PyTorch draws its own random numbers.  ``first calls`` is the time from a
compiled variant's first call until compiled code runs (fusegrad: the calls that make optimizer
state, record and compile, then the wait for the compile; torch.compile: its first two calls).

``python -m benchmarks.programs`` runs it; each workload's row is printed as soon as it is
measured, ``--json`` writes the results with the machine info and ``--plot`` draws the ratios
of the whole step against each peer.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import common, live, models, steps  # noqa: E402

IMPLS = ("fg_eager", "fg_compiled", "fg_module", "fg_step", "torch", "torch_compile")
WORKLOADS = ("LSTM-LM", "DCGAN", "Transformer", "VAE", "MNIST-CNN", "GPT")
REPS = (2, 12)  # warm-up, measured steps
QUICK_REPS = (1, 2)
BATCHES = 3  # distinct batches, cycled


@dataclass
class Workload:
    """One program: its modules, optimizers, step function and batches, for either framework.

    ``modules(lib, small)`` builds the modules (a dict); ``optimizers(lib, modules)`` their
    optimizers; ``step(lib, nets, opts, small)`` the step function over the nets (the modules,
    perhaps compiled), taking a batch and the carried state and returning the loss and the new
    carried state; ``batches(np, small)`` numpy batches; ``carry(lib, small)`` the state carried
    from step to step at the start (an LSTM's hidden state)."""

    modules: Callable[[Any, bool], dict]
    optimizers: Callable[[Any, dict], list]
    step: Callable[[Any, dict, list, bool], Callable]
    batches: Callable[[Any, bool], list]
    carry: Callable[[Any, bool], tuple] = lambda lib, small: ()


# ---- LSTM word language model -------------------------------------------------------------


def _lm_sizes(small: bool) -> dict:
    if small:
        return {"vocab": 50, "width": 16, "layers": 2, "seq": 6, "batch": 4}
    return {"vocab": 2000, "width": 200, "layers": 2, "seq": 35, "batch": 20}


def _lm_modules(lib: Any, small: bool) -> dict:
    s = _lm_sizes(small)
    nn = lib.nn

    class RNNModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.drop = nn.Dropout(0.2)
            self.encoder = nn.Embedding(s["vocab"], s["width"])
            self.rnn = nn.LSTM(s["width"], s["width"], s["layers"], dropout=0.2)
            self.decoder = nn.Linear(s["width"], s["vocab"])

        def forward(self, x: Any, hidden: tuple) -> tuple:
            emb = self.drop(self.encoder(x))
            output, hidden = self.rnn(emb, hidden)
            decoded = self.decoder(self.drop(output)).view(-1, s["vocab"])
            return lib.nn.functional.log_softmax(decoded, dim=1), hidden

    return {"model": RNNModel()}


def _lm_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    model, (opt,) = nets["model"], opts
    params = list(model.parameters())

    def step(x: Any, y: Any, h: Any, c: Any) -> tuple:
        opt.zero_grad()
        output, (h, c) = model(x, (h, c))
        loss = lib.nn.functional.nll_loss(output, y.view(-1))
        loss.backward()
        lib.nn.utils.clip_grad_norm_(params, 0.25)
        opt.step()
        return loss.detach(), h.detach(), c.detach()  # (truncated BPTT: the next step's start)

    return step


def _lm_batches(np: Any, small: bool) -> list:
    s = _lm_sizes(small)
    rng = np.random.default_rng(0)
    shape = (s["seq"], s["batch"])
    return [
        (rng.integers(0, s["vocab"], shape), rng.integers(0, s["vocab"], shape))
        for _ in range(BATCHES)
    ]


def _lm_carry(lib: Any, small: bool) -> tuple:
    s = _lm_sizes(small)
    shape = (s["layers"], s["batch"], s["width"])
    return (lib.zeros(shape), lib.zeros(shape))


# ---- DCGAN --------------------------------------------------------------------------------


def _gan_sizes(small: bool) -> dict:
    return {"nz": 8, "nf": 4, "batch": 2} if small else {"nz": 100, "nf": 32, "batch": 16}


def _gan_modules(lib: Any, small: bool) -> dict:
    s = _gan_sizes(small)
    nn, nz, nf = lib.nn, s["nz"], s["nf"]
    generator = nn.Sequential(
        nn.ConvTranspose2d(nz, nf * 4, 4, 1, 0, bias=False),
        nn.BatchNorm2d(nf * 4),
        nn.ReLU(True),
        nn.ConvTranspose2d(nf * 4, nf * 2, 4, 2, 1, bias=False),
        nn.BatchNorm2d(nf * 2),
        nn.ReLU(True),
        nn.ConvTranspose2d(nf * 2, nf, 4, 2, 1, bias=False),
        nn.BatchNorm2d(nf),
        nn.ReLU(True),
        nn.ConvTranspose2d(nf, 3, 4, 2, 1, bias=False),
        nn.Tanh(),
    )
    discriminator = nn.Sequential(
        nn.Conv2d(3, nf, 4, 2, 1, bias=False),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(nf, nf * 2, 4, 2, 1, bias=False),
        nn.BatchNorm2d(nf * 2),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(nf * 2, nf * 4, 4, 2, 1, bias=False),
        nn.BatchNorm2d(nf * 4),
        nn.LeakyReLU(0.2, inplace=True),
        nn.Conv2d(nf * 4, 1, 4, 1, 0, bias=False),
        nn.Sigmoid(),
    )
    return {"G": generator, "D": discriminator}


def _gan_optimizers(lib: Any, modules: dict) -> list:
    return [
        lib.optim.Adam(modules["D"].parameters(), lr=2e-4, betas=(0.5, 0.999)),
        lib.optim.Adam(modules["G"].parameters(), lr=2e-4, betas=(0.5, 0.999)),
    ]


def _gan_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    G, D = nets["G"], nets["D"]
    opt_d, opt_g = opts
    bce = lib.nn.BCELoss()

    def step(real: Any, noise: Any, ones: Any, zeros: Any) -> tuple:
        # the discriminator: real images labelled 1, generated ones 0
        opt_d.zero_grad()
        err_real = bce(D(real).view(-1), ones)
        err_real.backward()
        fake = G(noise)
        err_fake = bce(D(fake.detach()).view(-1), zeros)
        err_fake.backward()
        opt_d.step()
        # the generator: its images labelled 1 by the updated discriminator
        opt_g.zero_grad()
        err_g = bce(D(fake).view(-1), ones)
        err_g.backward()
        opt_g.step()
        return ((err_real + err_fake).detach() + err_g.detach(),)

    return step


def _gan_batches(np: Any, small: bool) -> list:
    s = _gan_sizes(small)
    rng = np.random.default_rng(0)
    b = s["batch"]
    return [
        (
            np.tanh(rng.standard_normal((b, 3, 32, 32))).astype(np.float32),
            rng.standard_normal((b, s["nz"], 1, 1)).astype(np.float32),
            np.ones(b, np.float32),
            np.zeros(b, np.float32),
        )
        for _ in range(BATCHES)
    ]


# ---- Transformer encoder-decoder ------------------------------------------------------------


def _tr_sizes(small: bool) -> dict:
    if small:
        return {"vocab": 30, "width": 16, "heads": 2, "layers": 1, "ff": 32, "batch": 2, "len": 5}
    return {"vocab": 500, "width": 64, "heads": 4, "layers": 2, "ff": 128, "batch": 16, "len": 20}


def _tr_modules(lib: Any, small: bool) -> dict:
    s = _tr_sizes(small)
    nn = lib.nn

    class Seq2Seq(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.src_emb = nn.Embedding(s["vocab"], s["width"])
            self.tgt_emb = nn.Embedding(s["vocab"], s["width"])
            self.pos = nn.Parameter(lib.randn(s["len"], s["width"]) * 0.02)
            self.transformer = nn.Transformer(
                s["width"],
                s["heads"],
                s["layers"],
                s["layers"],
                s["ff"],
                dropout=0.1,
                batch_first=True,
            )
            self.out = nn.Linear(s["width"], s["vocab"])

        def forward(self, src: Any, tgt: Any, tgt_mask: Any, src_pad: Any, tgt_pad: Any) -> Any:
            h = self.transformer(
                self.src_emb(src) + self.pos,
                self.tgt_emb(tgt) + self.pos,
                tgt_mask=tgt_mask,
                src_key_padding_mask=src_pad,
                tgt_key_padding_mask=tgt_pad,
                memory_key_padding_mask=src_pad,
            )
            return self.out(h)

    return {"model": Seq2Seq()}


def _tr_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    s = _tr_sizes(small)
    model, (opt,) = nets["model"], opts

    def step(src: Any, tgt: Any, labels: Any, tgt_mask: Any, src_pad: Any, tgt_pad: Any) -> tuple:
        opt.zero_grad()
        logits = model(src, tgt, tgt_mask, src_pad, tgt_pad)
        loss = lib.nn.functional.cross_entropy(
            logits.reshape(-1, s["vocab"]), labels.reshape(-1), ignore_index=0
        )
        loss.backward()
        opt.step()
        return (loss.detach(),)

    return step


def _tr_batches(np: Any, small: bool) -> list:
    s = _tr_sizes(small)
    rng = np.random.default_rng(0)
    b, n = s["batch"], s["len"]
    causal = np.triu(np.full((n, n), -np.inf, np.float32), 1)  # what the causal mask holds
    out = []
    for _ in range(BATCHES):
        lengths = rng.integers(n // 2, n + 1, b)
        pad = np.arange(n)[None, :] >= lengths[:, None]  # True: padding
        src = np.where(pad, 0, rng.integers(1, s["vocab"], (b, n)))
        tgt = np.where(pad, 0, rng.integers(1, s["vocab"], (b, n)))
        labels = np.where(pad, 0, rng.integers(1, s["vocab"], (b, n)))
        out.append((src, tgt, labels, causal, pad, pad.copy()))
    return out


# ---- VAE -------------------------------------------------------------------------------------


def _vae_sizes(small: bool) -> dict:
    return (
        {"pixels": 64, "hidden": 16, "latent": 4, "batch": 8}
        if small
        else {
            "pixels": 784,
            "hidden": 400,
            "latent": 20,
            "batch": 128,
        }
    )


def _vae_modules(lib: Any, small: bool) -> dict:
    s = _vae_sizes(small)
    nn = lib.nn
    F = lib.nn.functional

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(s["pixels"], s["hidden"])
            self.fc21 = nn.Linear(s["hidden"], s["latent"])
            self.fc22 = nn.Linear(s["hidden"], s["latent"])
            self.fc3 = nn.Linear(s["latent"], s["hidden"])
            self.fc4 = nn.Linear(s["hidden"], s["pixels"])

        def forward(self, x: Any) -> tuple:
            h1 = F.relu(self.fc1(x))
            mu, logvar = self.fc21(h1), self.fc22(h1)
            std = lib.exp(0.5 * logvar)
            z = mu + lib.randn_like(std) * std
            return lib.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar

    return {"model": VAE()}


def _vae_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    model, (opt,) = nets["model"], opts
    F = lib.nn.functional

    def step(x: Any) -> tuple:
        opt.zero_grad()
        recon, mu, logvar = model(x)
        bce = F.binary_cross_entropy(recon, x, reduction="sum")
        kld = -0.5 * lib.sum(1 + logvar - mu.pow(2) - logvar.exp())
        loss = bce + kld
        loss.backward()
        opt.step()
        return (loss.detach(),)

    return step


def _vae_batches(np: Any, small: bool) -> list:
    s = _vae_sizes(small)
    rng = np.random.default_rng(0)
    return [(rng.random((s["batch"], s["pixels"])).astype(np.float32),) for _ in range(BATCHES)]


# ---- MNIST CNN --------------------------------------------------------------------------------


def _cnn_modules(lib: Any, small: bool) -> dict:
    nn = lib.nn
    F = lib.nn.functional

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.25)
            self.dropout2 = nn.Dropout(0.5)
            self.fc1 = nn.Linear(9216, 128)
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            x = F.relu(self.conv1(x))
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = lib.flatten(self.dropout1(x), 1)
            x = self.dropout2(F.relu(self.fc1(x)))
            return F.log_softmax(self.fc2(x), dim=1)

    return {"model": Net()}


def _cnn_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    model, (opt,) = nets["model"], opts

    def step(x: Any, y: Any) -> tuple:
        opt.zero_grad()
        loss = lib.nn.functional.nll_loss(model(x), y)
        loss.backward()
        opt.step()
        return (loss.detach(),)

    return step


def _cnn_batches(np: Any, small: bool) -> list:
    rng = np.random.default_rng(0)
    b = 4 if small else 64
    return [
        (rng.standard_normal((b, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, b))
        for _ in range(BATCHES)
    ]


# ---- GPT -------------------------------------------------------------------------------------


def _gpt_sizes(small: bool) -> dict:
    return {"vocab": 17, "width": 16, "heads": 2, "block": 8} if small else dict(steps.GPT)


def _gpt_step(lib: Any, nets: dict, opts: list, small: bool) -> Callable:
    model, (opt,) = nets["model"], opts

    def step(x: Any, y: Any) -> tuple:
        opt.zero_grad()
        loss = models.loss(lib, model, x, y)
        loss.backward()
        opt.step()
        return (loss.detach(),)

    return step


def _gpt_batches(np: Any, small: bool) -> list:
    s = _gpt_sizes(small)
    rng = np.random.default_rng(0)
    shape = (2 if small else 8, s["block"])
    return [
        (rng.integers(0, s["vocab"], shape), rng.integers(0, s["vocab"], shape))
        for _ in range(BATCHES)
    ]


def _one(optimizer: str, **options: Any) -> Callable[[Any, dict], list]:
    """``optimizer`` (a name in ``lib.optim``) over the parameters of the one module."""
    return lambda lib, modules: [
        getattr(lib.optim, optimizer)(modules["model"].parameters(), **options)
    ]


SPECS = {
    "LSTM-LM": Workload(
        _lm_modules,
        lambda lib, m: [lib.optim.SGD(m["model"].parameters(), lr=20.0)],
        _lm_step,
        _lm_batches,
        _lm_carry,
    ),
    "DCGAN": Workload(_gan_modules, _gan_optimizers, _gan_step, _gan_batches),
    "Transformer": Workload(_tr_modules, _one("Adam", lr=1e-3), _tr_step, _tr_batches),
    "VAE": Workload(_vae_modules, _one("Adam", lr=1e-3), _vae_step, _vae_batches),
    "MNIST-CNN": Workload(_cnn_modules, _one("Adadelta", lr=1.0), _cnn_step, _cnn_batches),
    "GPT": Workload(
        lambda lib, small: {"model": models.make(lib, "gpt", **_gpt_sizes(small))},
        _one("AdamW", lr=1e-3),
        _gpt_step,
        _gpt_batches,
    ),
}


# ---- running one implementation --------------------------------------------------------------


def _to(lib: Any, array: Any) -> Any:
    """A numpy batch element as a tensor of ``lib`` (boolean masks stay boolean)."""
    return lib.tensor(array)


def _impl(
    lib: Any,
    spec: Workload,
    states: dict,
    data: list,
    small: bool,
    *,
    wrap_model: Callable | None = None,
    wrap_step: Callable | None = None,
    context: Callable | None = None,
    rng: Any = None,
) -> steps.StepImpl:
    """One implementation of a workload: its modules loaded from ``states``, optimizers and
    step function, and a timed call that runs the next batch (inside ``context()``, when
    given: ``compiled_autograd``)."""
    modules = spec.modules(lib, small)
    for name, module in modules.items():
        module.load_state_dict(copy.deepcopy(states[name]))
    nets = {k: wrap_model(m) if wrap_model is not None else m for k, m in modules.items()}
    opts = spec.optimizers(lib, modules)
    fn = spec.step(lib, nets, opts, small)
    fn = wrap_step(fn) if wrap_step is not None else fn
    batches = [tuple(_to(lib, a) for a in batch) for batch in data]
    carry = [spec.carry(lib, small)]
    counter = [0]
    generator = [rng]  # this implementation's generator state (fusegrad's; None for torch)

    def timed() -> dict[str, float]:
        batch = batches[counter[0] % len(batches)]
        counter[0] += 1
        if rng is not None:
            lib.random.set_rng_state(generator[0])
        if context is not None:
            with context():
                t0 = common.clock()
                _, *state = fn(*batch, *carry[0])
                t1 = common.clock()
        else:
            t0 = common.clock()
            _, *state = fn(*batch, *carry[0])
            t1 = common.clock()
        carry[0] = tuple(state)
        if rng is not None:
            generator[0] = lib.random.get_rng_state()
        return {"step": t1 - t0}

    def params() -> list:
        return [p.detach().numpy().copy() for m in modules.values() for p in m.parameters()]

    compiled = [fn] if wrap_step is not None else list(nets.values()) if wrap_model else []
    return steps.StepImpl(timed, params, compiled=compiled)


def run(
    np: Any,
    fg: Any,
    torch: Any | None,
    torch_compile: bool,
    names: Sequence[str] = WORKLOADS,
    quick: bool = False,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: str = "off",
) -> dict[str, Any]:
    """Measure every workload; returns ``{"rows": [...], "checks": {...}, "notes": {...}}``."""
    fc = importlib.import_module("fusegrad.compiler")
    rows, checks, notes = [], {}, {}
    for index, name in enumerate(names, 1):
        spec = SPECS[name]
        bar = live.Progress(name, mode=progress, position=(index, len(names)))
        bar.stage("building and compiling (first calls of every implementation)")
        fg.manual_seed(0)
        states = {
            k: {n: v.detach().clone() for n, v in m.state_dict().items()}
            for k, m in spec.modules(fg, quick).items()
        }
        data = spec.batches(np, quick)
        fg.manual_seed(1)
        rng = fg.random.get_rng_state()  # every fusegrad implementation draws the same numbers
        impls = {
            "fg_eager": _impl(fg, spec, states, data, quick, rng=rng),
            "fg_compiled": _impl(
                fg, spec, states, data, quick, context=fc.compiled_autograd, rng=rng
            ),
            "fg_module": _impl(fg, spec, states, data, quick, wrap_model=fg.compile, rng=rng),
            "fg_step": _impl(fg, spec, states, data, quick, wrap_step=fg.compile, rng=rng),
        }
        wl_notes: dict[str, str] = {}
        if torch is not None:
            tstates = {
                k: {n: torch.from_numpy(v.numpy().copy()) for n, v in s.items()}
                for k, s in states.items()
            }
            steps.add_torch(
                impls,
                lambda wrap, spec=spec, states=tstates, data=data: _impl(
                    torch, spec, states, data, quick, wrap_model=wrap
                ),
                torch.compile if torch_compile else None,
                wl_notes,
            )
        # the compiled variants' first calls (optimizer state, recording, compiling), until
        # compiled code runs; eager takes as many steps, so all have seen the same batches.
        # (The checks count the breaks from here on: those of the recordings too.)
        # Then the calls of the trial between a program's two candidates (interpreted small
        # kernels or generated code, ``service.Trial``: they run in turn, the faster stays),
        # before anything is measured; eager takes as many steps.
        breaks_before = dict(fc.counters.step_breaks)
        for key in ("fg_step", "fg_module", "fg_compiled"):
            t0 = common.clock()
            for _ in range(3):
                impls[key].step()
            fc.wait_for_compiles()
            impls[key].first_calls_s = common.clock() - t0
        for _ in range(3):
            impls["fg_eager"].step()
        if not quick:
            steps.settle(impls, ("fg_step", "fg_module", "fg_compiled"), ("fg_eager",))
        warmup, reps = QUICK_REPS if quick else REPS
        before = (fc.counters.step_runs, breaks_before)
        medians, checks[name] = steps.measure(
            np, fc, impls, IMPLS, ("fg_compiled", "fg_module", "fg_step"), warmup, reps, bar, before
        )
        row: dict[str, Any] = {
            "workload": name,
            "unit": "ms",
            **medians,
            "first_calls_s": {k: i.first_calls_s for k, i in impls.items()},
        }
        for num in ("fg_eager", "fg_compiled", "fg_module", "fg_step"):
            for peer in ("torch", "torch_compile"):
                row[f"{num}/{peer}"] = common.ratio(medians[num], medians[peer])
        row.update(
            {
                f"fg_step/{o}": common.ratio(medians["fg_step"], medians[o])
                for o in IMPLS
                if o != "fg_step"
            }
        )
        row["fg_compiled/fg_eager"] = common.ratio(medians["fg_compiled"], medians["fg_eager"])
        rows.append(row)
        wl_notes["programs"] = steps.program_notes(impls)
        notes[name] = wl_notes
        if on_row is not None:
            on_row(row)
        bar.close()
    return {"rows": rows, "checks": checks, "notes": notes}


# ---- the table ---------------------------------------------------------------------------------

HEADERS = {k: steps.STEP_HEADERS[k] for k in IMPLS}
RATIOS = [
    ("fg_eager/torch", "eager/torch"),
    ("fg_compiled/fg_eager", "compiled bwd/fg eager"),
    ("fg_module/torch", "model/torch"),
    ("fg_step/torch", "step/torch"),
    ("fg_step/torch_compile", "step/torch.compile"),
    ("fg_step/fg_eager", "step/fg eager"),
]


def planned_impls(have_torch: bool, torch_compile: bool) -> list[str]:
    skip = set() if have_torch else {"torch", "torch_compile"}
    if not torch_compile:
        skip.add("torch_compile")
    return [k for k in IMPLS if k not in skip]


def table_headers(impls: Sequence[str]) -> list[str]:
    ratios = [label for key, label in RATIOS if key.split("/")[1] in impls]
    return [
        "workload",
        "unit",
        *(HEADERS[k] for k in impls),
        *ratios,
        "first calls (s): model / step",
    ]


def table_cells(row: dict[str, Any], impls: Sequence[str]) -> list[str]:
    cells = [row["workload"], row["unit"]]
    cells += [common.format_number(row.get(k)) for k in impls]
    for key, _ in RATIOS:
        if key.split("/")[1] in impls:
            value = row.get(key)
            cells.append(common.format_number(value, 2) + "×" if value is not None else "—")
    first = row["first_calls_s"]
    cells.append(
        f"{common.format_number(first.get('fg_module'))} / "
        f"{common.format_number(first.get('fg_step'))}"
    )
    return cells


def render(result: dict[str, Any]) -> str:
    present = [k for k in IMPLS if any(r.get(k) is not None for r in result["rows"])]
    headers = table_headers(present)
    body = [table_cells(row, present) for row in result["rows"]]
    table = common.markdown_table(headers, body, ["l", "l"] + ["r"] * (len(headers) - 2))
    notes = steps.render_notes(result)
    return table + ("\n" + notes if notes else "")


PLOT_PANELS = [
    {
        "title": "real-program training steps: fg whole step time / peer's step time",
        "numerator": "fg_step",
        "peers": [k for k in IMPLS if k != "fg_step"],
        "metrics": None,
    }
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.programs", description=__doc__)
    steps.add_arguments(parser, WORKLOADS, "programs.json", "tiny sizes, 1+2 steps: a smoke test")
    args = parser.parse_args(argv)
    names = steps.workload_names(parser, args, WORKLOADS)
    threads = common.pin_threads(args.threads)
    import numpy as np

    import fusegrad as fg

    torch, torch_compile = steps.peers(args)
    environment = common.environment(threads=args.threads)
    quick_note = " (QUICK: smoke test, not a measurement)" if args.quick else ""
    live.emit(f"# training steps shaped like real programs{quick_note}")
    live.emit()
    live.emit(f"machine: {common.describe_environment(environment)}")
    warmup, reps = QUICK_REPS if args.quick else REPS
    live.emit(
        f"threads: {args.threads}; warm-up/measured steps: {warmup}/{reps}; torch: "
        + ("not used" if torch is None else torch.__version__)
        + ("" if torch_compile or torch is None else "; torch.compile skipped")
    )
    live.emit(
        "Times: median wall time of one training step in ms, from one interleaved run. "
        + live.RATIO_CONVENTION
        + " 'model' is fg compile(model), 'step' fg compile(step). 'first calls': seconds "
        "from a compiled variant's first call until its compiled code runs."
    )
    live.emit()
    planned = planned_impls(torch is not None, torch_compile)
    headers = table_headers(planned)
    stream = live.StreamTable(
        headers, ["l", "l"] + ["r"] * (len(headers) - 2), widths=[max(len(n) for n in names), 4]
    )
    stream.start()
    result = run(
        np,
        fg,
        torch,
        torch_compile,
        names,
        args.quick,
        on_row=lambda row: stream.row(table_cells(row, planned)),
        progress=args.progress,
    )
    live.emit()
    live.emit(steps.render_notes(result))
    present = [k for k in IMPLS if any(r.get(k) is not None for r in result["rows"])]
    payload = {
        "benchmark": "programs",
        "quick": args.quick,
        "threads": threads,
        "implementations": present,
        "columns": dict(HEADERS),
        "ratio_convention": "a/b: a's median step time divided by b's, in the same run "
        "(below 1: a is faster)",
        "plot_panels": PLOT_PANELS,
        **result,
        "table": render(result),
        "environment": environment,
    }
    steps.write_results(args, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
