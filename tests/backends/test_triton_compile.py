"""The triton backend's kernels compile for an H100 (sm_90) without a GPU.

The interpreter runs kernels as NumPy and accepts code the Triton compiler refuses
(globals that are not constexpr, Python ints where tensors are needed, ...). Here
every kernel is compiled to a CUDA binary for sm_90, in a fresh process without
``TRITON_INTERPRET``, from the arguments a real call would launch it with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    import attnkit
    from attnkit import masks, scores
    from attnkit._inputs import validate_inputs
    from attnkit.backends.triton import backward, forward, weights
    from attnkit.backends.triton.backend import _operands
    from attnkit.backends.triton.launch import KernelCall

    POINTER = {torch.float16: "*fp16", torch.bfloat16: "*bf16", torch.float32: "*fp32",
               torch.int64: "*i64", torch.uint8: "*u8"}
    KERNELS = [(forward, "attention_forward_kernel"), (weights, "attention_weights_kernel"),
               (backward, "attention_backward_dkdv_kernel"),
               (backward, "attention_backward_dq_kernel")]

    class Recorder:
        def __init__(self, name, launches):
            self.name, self.launches = name, launches
        def __getitem__(self, grid):
            return lambda **kw: self.launches.append((self.name, kw))

    def launches_of(dtype, score, mask, mean):
        launches = []
        real = {name: getattr(mod, name) for mod, name in KERNELS}
        for mod, name in KERNELS:
            setattr(mod, name, Recorder(name, launches))
        try:
            B, H, L, S, E = 2, 4, 64, 64, 64
            q = torch.randn(B, H, L, E, dtype=dtype)
            k = torch.randn(B, 2, S, E, dtype=dtype)
            v = torch.randn(B, 2, S, E, dtype=dtype)
            inputs = validate_inputs(q, k, v, score=score, mask=mask)
            qa, ka, kb, w, _ = _operands(inputs)
            call = KernelCall.build(qa, ka, v, kb, w, scale=inputs.scale, mask=inputs.mask,
                                    batch_shape=inputs.batch_shape, groups=inputs.groups)
            lse = torch.zeros(B, H, L)
            call.forward(dtype)
            call.weights(lse, mean=mean)
            call.backward(torch.zeros(B, H, L, E, dtype=dtype), lse, lse, torch.zeros(B, H, L, S))
        finally:
            for mod, name in KERNELS:
                setattr(mod, name, real[name])
        return [(real[name], kw) for name, kw in launches]

    def compile_one(kernel, args):
        options = {k: args.pop(k) for k in ("num_warps", "num_stages")}
        signature, constants = {}, {}
        for p in kernel.params:
            value = args[p.name]
            if p.is_constexpr:
                signature[p.name], constants[p.name] = "constexpr", value
            elif isinstance(value, torch.Tensor):
                signature[p.name] = POINTER[value.dtype]
            else:
                signature[p.name] = "fp32" if isinstance(value, float) else "i32"
        src = ASTSource(kernel, signature, constants)
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)

    lens = torch.tensor([30, 64])
    pad = torch.zeros(2, 64, dtype=torch.bool)
    configs = [  # every mask kind, the key bias and head-averaged weights; the Additive score
        (torch.bfloat16, scores.Gaussian(1.5),
         masks.causal() & masks.window(8, None, align="bottom_right")
         & masks.valid_lens(lens, queries=True) & masks.key_padding(pad)
         & masks.bias(torch.zeros(64, 64)) & masks.keep(torch.ones(2, 1, 64, 64, dtype=torch.bool)),
         True),
        (torch.float32, scores.Additive(64, 64, 40), masks.valid_lens(torch.full((2, 64), 40)),
         False),
    ]
    done = []
    for dtype, score, mask, mean in configs:
        for kernel, args in launches_of(dtype, score, mask, mean):
            compile_one(kernel, dict(args))
            done.append(f"{kernel.__name__}:{dtype}")
    print(json.dumps(done))
    """
)


def test_every_kernel_compiles_for_sm90() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("this triton install has no ptxas to build CUDA binaries with")
    assert proc.returncode == 0, proc.stderr[-4000:]
    compiled = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(compiled) == 8  # 4 kernels x 2 configurations
