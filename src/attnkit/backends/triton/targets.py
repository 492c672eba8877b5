"""The Triton backend on every NVIDIA target, checked without a GPU.

``python -m attnkit.backends.triton.targets`` (or ``attnkit explain --gpu-targets``)
compiles every kernel specialization that a set of attention calls makes the backend
pick, for sm_75 (T4), sm_80 (A100), sm_86 (RTX 30xx, A10), sm_89 (L4, RTX 40xx) and
sm_90 (H100), through attnkit's own host code (the tile table chooses per target),
and prints per target: calls compiled, kernels, kernels whose shared memory exceeds
the target's per-block limit, and register spills (``ptxas -v``).

A target passes when every call compiles, every kernel fits its shared memory, and
no half-precision kernel spills registers on sm_80 or newer (float32 kernels and the
Additive score's backward may spill; their spills are listed with their size).

``--full`` compiles the whole matrix (every score, mask kind and dtype, head dims
16 to 256 including odd ones, weights and the backward); the default is a
representative subset that covers each kernel family once per target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ... import _torch_features as torch_features
from ... import masks, scores
from .runtime import SHARED_MEMORY

__all__ = ["TARGETS", "Call", "TargetReport", "calls", "check", "main", "table"]

TARGETS = (75, 80, 86, 89, 90)
_MODULE = "attnkit.backends.triton.targets"
CARDS = {75: "T4", 80: "A100", 86: "RTX 30xx, A10", 89: "L4, RTX 40xx", 90: "H100, H200"}
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
MASK_KINDS = (
    "none", "causal", "causal_bottom_right", "window", "valid_lens", "valid_lens_queries",
    "valid_lens_2d", "key_padding", "keep", "bias", "every_kind",
)  # fmt: skip


@dataclass(frozen=True)
class Call:
    """One attention call: score, mask kind, dtype, head dims (E, Ev), what it returns."""

    score: str
    mask: str
    dtype: str
    E: int = 64
    Ev: int = 0
    weights: str = "heads"  # "none", "heads" or "mean"
    backward: bool = True
    gqa: bool = False

    @property
    def label(self) -> str:
        dims = f"E={self.E}" + (f",Ev={self.Ev}" if self.Ev else "")
        parts = [self.score, self.mask, self.dtype, dims]
        parts += [f"weights={self.weights}"] if self.weights != "none" else []
        parts += ["backward"] if self.backward else []
        parts += ["gqa"] if self.gqa else []
        return " ".join(parts)


def _mask(kind: str, B: int, L: int, S: int) -> Any:
    lens = torch.tensor([S // 2, S])[:B]
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, -3:] = True
    made: dict[str, Callable[[], Any]] = {
        "none": lambda: None,
        "causal": lambda: masks.causal(),
        "causal_bottom_right": lambda: masks.causal("bottom_right"),
        "window": lambda: masks.window(8, 4, align="bottom_right"),
        "valid_lens": lambda: masks.valid_lens(lens),
        "valid_lens_queries": lambda: masks.valid_lens(lens, queries=True),
        "valid_lens_2d": lambda: masks.valid_lens(torch.full((B, L), S // 2)),
        "key_padding": lambda: masks.key_padding(pad),
        "keep": lambda: masks.keep(torch.ones(B, 1, L, S, dtype=torch.bool)),
        "bias": lambda: masks.bias(torch.zeros(L, S)),
        "prefix_lm": lambda: masks.prefix_lm(lens),  # two clauses: causal | prefix
        "every_kind": lambda: (
            masks.causal() & masks.window(8, None, align="bottom_right")
            & masks.valid_lens(lens, queries=True) & masks.key_padding(pad)
            & masks.bias(torch.zeros(L, S)) & masks.keep(torch.ones(B, 1, L, S, dtype=torch.bool))
        ),
    }  # fmt: skip
    return made[kind]()


def _score(name: str, E: int, Ek: int, dtype: torch.dtype) -> Any:
    if name == "bilinear":
        return scores.Bilinear(E, Ek, dtype=dtype)
    if name == "additive":
        return scores.Additive(E, Ek, 40, dtype=dtype)
    if name == "gaussian":
        return scores.Gaussian(1.5)
    return name


def calls(full: bool = False, *, arch: int = 90) -> list[Call]:
    """The calls compiled for sm_``arch``: a representative subset, or the whole matrix.
    bfloat16 is left out on sm_75, where the backend refuses it (no bfloat16 MMA)."""
    half = "fp16" if arch < 80 else "bf16"
    wide_grad = arch >= 80  # sm_75 refuses the backward of head dims over 128
    if not full:
        return [  # the dot form in half precision with every mask field, the largest
            # head dims, float32 tiles and the Additive kernels
            Call("gaussian", "every_kind", half, 128, gqa=True),
            Call("bilinear", "valid_lens_2d", "fp16", 256, 256, weights="none", backward=wide_grad),
            Call("dot", "key_padding", "fp32", 80, weights="mean", backward=False),
            Call("additive", "bias", "fp16", 64, weights="none"),
            Call("scaled_dot", "prefix_lm", half, 64),  # two mask clauses
        ]
    dtypes = [d for d in _DTYPES if not (d == "bf16" and arch < 80)]
    out = [
        Call(score, "causal", dtype, E, backward=E <= 128 or wide_grad)
        for score in ("dot", "scaled_dot", "bilinear", "gaussian", "additive")
        for dtype in dtypes
        for E in (64, 128, 256)
    ]
    out += [
        Call("scaled_dot", "causal", dtype, E, weights="none", backward=E <= 128 or wide_grad)
        for dtype in dtypes
        for E in (16, 17, 40, 80, 100, 160, 255)
    ]
    out += [
        Call("scaled_dot", "none", "fp16", 64, 200, weights="none", backward=wide_grad)
    ]  # Ev > E
    out += [Call("gaussian", kind, half, 64) for kind in MASK_KINDS]
    out += [Call("additive", kind, "fp32", 64, weights="none") for kind in ("valid_lens", "keep")]
    out += [Call("gaussian", "every_kind", d, 64, weights="mean", backward=False) for d in dtypes]
    out += [Call("scaled_dot", "every_kind", d, 128, gqa=True) for d in dtypes]
    return out


def _run(call: Call) -> None:
    """Make the backend launch every kernel of ``call`` (compile-only inside
    :func:`.compileonly.compile_only`)."""
    from ..._inputs import validate_inputs
    from .backend import TritonBackend

    dtype = _DTYPES[call.dtype]
    B, H, L, S = 2, 4, 64, 64
    Ek = call.E  # Bilinear: the kernels see its key dim
    Ev = call.Ev or call.E
    Hk = H // 2 if call.gqa else H
    grad = call.backward
    q = torch.randn(B, H, L, call.E, dtype=dtype, requires_grad=grad)
    k = torch.randn(B, Hk, S, Ek, dtype=dtype, requires_grad=grad)
    v = torch.randn(B, Hk, S, Ev, dtype=dtype, requires_grad=grad)
    weights: bool | str = "mean" if call.weights == "mean" else call.weights == "heads"
    inputs = validate_inputs(
        q, k, v, score=_score(call.score, call.E, Ek, dtype), mask=_mask(call.mask, B, L, S),
        return_weights=weights,
    )  # fmt: skip
    result = TritonBackend().forward(inputs)
    if grad:
        loss = result.output.float().sum()
        if result.weights is not None:
            loss = loss + result.weights.sum()
        loss.backward()


@dataclass
class TargetReport:
    """What one target gave: calls compiled (of all), kernels, and the failures."""

    arch: int
    calls: int = 0
    compiled: int = 0
    kernels: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def limit(self) -> int:
        return SHARED_MEMORY[self.arch]

    def over_limit(self) -> list[dict[str, Any]]:
        return [k for k in self.kernels if k["shared"] > self.limit]

    def spilling(self) -> list[dict[str, Any]]:
        return [k for k in self.kernels if k["spill_stores"] + k["spill_loads"] > 0]

    def forbidden_spills(self) -> list[dict[str, Any]]:
        """Half-precision kernels that spill on sm_80 or newer, the Additive backward
        excepted."""
        if self.arch < 80:
            return []
        return [
            k
            for k in self.spilling()
            if k["dtype"] != "fp32" and not (k["score"] == "additive" and "backward" in k["name"])
        ]

    @property
    def passed(self) -> bool:
        return not self.errors and not self.over_limit() and not self.forbidden_spills()


def check(
    targets: tuple[int, ...] = TARGETS, *, full: bool = False, only: list[Call] | None = None
) -> list[TargetReport]:
    """Compile every call (of :func:`calls`, or ``only``) for every target; see the
    module docstring."""
    from .compileonly import compile_only, newest_ptxas, ptxas_report

    ptxas = newest_ptxas()
    if ptxas is None:
        raise RuntimeError("this triton install ships no ptxas (its NVIDIA backend is missing)")
    reports = []
    for arch in targets:
        report = TargetReport(arch)
        seen: set[str] = set()
        for call in only if only is not None else calls(full, arch=arch):
            report.calls += 1
            with compile_only(arch) as sink:
                try:
                    _run(call)
                except Exception as exc:  # a compile error is this check's finding
                    report.errors.append(f"{call.label}: {type(exc).__name__}: {exc}"[:400])
                    continue
            report.compiled += 1
            for key, kernel in sink.kernels.items():
                if key in seen:
                    continue
                seen.add(key)
                ptxas_report(kernel, arch, ptxas)
                entry = asdict(kernel)
                entry.update(call=call.label, dtype=call.dtype, score=call.score)
                report.kernels.append(entry)
        reports.append(report)
    return reports


def trace_check(arch: int = 90) -> dict[str, list[str]] | None:
    """How ``torch.compile`` sees the ops: each op is traced as AOTAutograd traces it
    (fake tensors, functionalized) for sm_``arch``; returns, per kernel the graph
    launches, the arguments Triton's mutation analysis found written (what the compiler
    must treat as outputs). None where the ops are not ``triton_op``s (opaque
    ``custom_op``s: nothing to see into)."""
    from torch._functorch.aot_autograd import aot_function
    from triton.runtime.driver import driver

    from ...blockplan import Clause
    from .compileonly import _StandInDriver
    from .maskargs import MaskSpec, pack_mask
    from .ops import attention_backward, attention_forward, uses_triton_op
    from .runtime import TARGET_ARCH

    if not uses_triton_op():
        return None
    B, H, L, S, E = 2, 2, 64, 64, 64
    q, k, v = (torch.randn(B, H, n, E, dtype=torch.float16) for n in (L, S, S))
    kb = torch.zeros(B, H, S)
    packed = pack_mask(MaskSpec([Clause(hi=0)]), L, S, (B, H), q.device)

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kb: torch.Tensor, rec: Any) -> Any:
        margs = (rec, None, None, packed.ints, 0.125)
        out, lse, weights = attention_forward(q, k, v, kb, None, None, *margs, True)
        grads = attention_backward(
            q, k, v, kb, None, *margs, out, lse, out, lse, weights, weights
        )  # the tensors only stand for gradients here: traced, never run
        return (out, lse, weights, *grads)

    found: dict[str, list[str]] = {}

    def compiler(gm: torch.fx.GraphModule, inputs: Any) -> Any:
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        for node in gm.graph.nodes:
            if "triton_kernel_wrapper" in str(node.target):
                kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
                name = getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel))
                found[name] = sorted(node.kwargs.get("tensors_to_clone", []))
        n_out = len(next(n for n in gm.graph.nodes if n.op == "output").args[0])
        return lambda *a: [torch.zeros(1)] * n_out  # traced only: nothing runs

    saved = dict(driver.__dict__)
    driver.set_active(_StandInDriver(arch))
    token = TARGET_ARCH.set(arch)
    try:
        aot_function(run, fw_compiler=compiler)(q, k, v, kb, packed.records)  # type: ignore[arg-type]
    finally:
        TARGET_ARCH.reset(token)
        driver.__dict__.clear()
        driver.__dict__.update(saved)
    return found


def _bytes(k: dict[str, Any]) -> str:
    return f"{k['name'].removeprefix('attention_')} {k['dtype']} {k['spill_stores']}+{k['spill_loads']} B"


def table(reports: list[TargetReport]) -> str:
    """A Markdown table: target, calls compiled, smem over the limit, register spills."""
    import triton

    rows = [
        f"Triton {triton.__version__}, torch {torch.__version__}; spills as stores+loads",
        "",
        "| target | compiles | kernels | shared memory over the per-block limit "
        "| register spills | half on tensor cores | passes |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        over = r.over_limit()
        spills = r.spilling()
        over_txt = str(len(over)) + (
            ": " + ", ".join(f"{k['name']} {k['shared'] // 1024} KiB" for k in over[:3])
            if over
            else ""
        )
        spill_txt = str(len(spills)) + (
            ": " + ", ".join(_bytes(k) for k in spills[:4]) if spills else ""
        )
        if len(spills) > 4:
            spill_txt += ", ..."
        # half-precision products (float32 ones are IEEE, on FMA like torch's matmul;
        # the Additive score's tanh sums have none)
        dots = [k for k in r.kernels if k["score"] != "additive" and k["dtype"] != "fp32"]
        fma = sum(k["mma"] == 0 for k in dots)
        cores = "yes" if not fma else f"no: {fma}/{len(dots)} half kernels on FMA"
        rows.append(
            f"| sm_{r.arch} ({CARDS[r.arch]}, {r.limit // 1024} KiB) | {r.compiled}/{r.calls} "
            f"| {len(r.kernels)} | {over_txt} | {spill_txt} | {cores} "
            f"| {'yes' if r.passed else 'NO'} |"
        )
    for r in reports:
        rows += [f"sm_{r.arch}: {e}" for e in r.errors]
    return "\n".join(rows)


def _in_parallel(targets: tuple[int, ...], full: bool, jobs: int) -> list[TargetReport]:
    """:func:`check` with one child process per target, ``jobs`` at a time."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def one(arch: int) -> TargetReport:
        cmd = [sys.executable, "-W", "ignore", "-m", _MODULE, "--json", "--targets", str(arch)]
        proc = subprocess.run(cmd + (["--full"] if full else []), capture_output=True, text=True)
        if proc.returncode not in (0, 1):
            raise RuntimeError(proc.stderr.strip()[-2000:])
        row = json.loads(proc.stdout.strip().splitlines()[-1])["targets"][0]
        row.pop("passed")
        return TargetReport(**row)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, targets))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m attnkit.backends.triton.targets",
        description="compile the triton kernels for every NVIDIA target, without a GPU",
    )
    parser.add_argument("--full", action="store_true", help="the whole matrix (slow)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument(
        "--targets", default=",".join(map(str, TARGETS)), help="e.g. 80,90 (default: all)"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="targets compiled at once, in child processes"
    )
    args = parser.parse_args(argv)
    try:
        targets = tuple(int(t.removeprefix("sm_")) for t in args.targets.split(","))
    except ValueError:
        print(f"targets: expected numbers like 80,90, got {args.targets!r}", file=sys.stderr)
        return 2
    unknown = [t for t in targets if t not in SHARED_MEMORY]
    if unknown:
        print(f"targets: unknown {unknown}; expected some of {list(TARGETS)}", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET: the interpreter compiles nothing", file=sys.stderr)
        return 2
    below_floor = torch_features.missing("triton")
    if below_floor is not None:
        print(f"cannot compile for GPU targets here: {below_floor}", file=sys.stderr)
        return 3
    try:
        if args.jobs > 1 and len(targets) > 1:
            reports = _in_parallel(targets, args.full, args.jobs)
        else:
            reports = check(targets, full=args.full)
    except (ImportError, RuntimeError) as exc:
        print(f"cannot compile for GPU targets here: {exc}", file=sys.stderr)
        return 3
    traced = trace_check(targets[-1])
    if args.json:
        rows = [{**asdict(r), "passed": r.passed} for r in reports]
        print(json.dumps({"targets": rows, "traced": traced}))
    else:
        print(table(reports))
        if traced is not None:
            print(f"\ntorch.compile sees the kernels (triton ops); written arguments: {traced}")
    return 0 if all(r.passed for r in reports) else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
