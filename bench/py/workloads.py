"""Real framework workloads for the compute-share benchmark (bench/py/share.py).

usage: workloads.py KIND [--seconds S]
  matmul   PyTorch bf16 8192^3 matmul loop (cuBLAS), synchronize every 10
  gpt2     GPT-2 124M training from GPT2Config() (random weights), bf16 autocast, AdamW, 8x512
  resnet   torchvision ResNet-50 training on random data, batch 64, bf16 autocast, SGD
  graph    batch-1 ResNet-50 inference replayed from a CUDA graph, synchronize each request
  eager    batch-1 GPT-2 124M inference (random weights, fp16, 64 tokens) in eager mode, synchronize
           each request: Python paces its short kernels, the GPU idles between them
  compile  a torch.compile'd transformer block (Triton kernels) training step
  jax      a jitted JAX MLP training step (XLA's own kernels and command buffers), bf16, SGD
  cupy     CuPy: cuBLAS matmul, an NVRTC-compiled elementwise kernel and a reduction, in a loop,
           synchronize every 10
Prints `progress t=<time.monotonic()> n=<steps>` about every 250 ms (after warm-up), until
killed or S seconds pass (default: forever); with STEP_TIMES set, also `step t=...` after every step.
"""
import os
import sys
import time

torch = None  # imported by the PyTorch kinds only (a JAX or CuPy run never loads it)
SYNC = []  # the kind's "wait for the device" (set by the kind's builder)


def use_torch():
    global torch
    import torch as t
    torch = t
    SYNC.append(torch.cuda.synchronize)


def matmul():
    use_torch()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    i = 0

    def step():
        nonlocal i
        torch.matmul(a, b, out=c)
        i += 1
        if i % 10 == 0:
            torch.cuda.synchronize()
    return step


def training(loss_fn, opt):
    """One training step: bf16 autocast forward, backward, optimizer, loss read back (as a
    training loop logs it)."""
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
    return step


def gpt2():
    use_torch()
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    x = torch.randint(0, 50257, (8, 512), device="cuda")
    return training(lambda: model(x, labels=x).loss, torch.optim.AdamW(model.parameters(), lr=1e-4))


def resnet():
    use_torch()
    import torchvision
    model = torchvision.models.resnet50().cuda()
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    lossf = torch.nn.CrossEntropyLoss()
    return training(lambda: lossf(model(x), y), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))


class word_linger:
    """A one-thread spin that runs until a word of pinned host memory moves or its cycles pass
    (CuPy's NVRTC builds it; the pointer of pinned memory is the device's too, under unified
    addressing). `start(stream, cycles)` queues one spin on a torch stream; `stop()` moves the
    word, which ends the spin queued last (each spins while the word still holds its number)."""

    SRC = r"""
    extern "C" __global__ void vgpu_word_linger(volatile unsigned int* word, unsigned int gen, long long cycles) {
        long long t0 = clock64();
        while (*word == gen && clock64() - t0 < cycles) {}
    }"""

    def __init__(self):
        import cupy
        import numpy
        self.cupy, self.numpy = cupy, numpy
        self.mem = cupy.cuda.alloc_pinned_memory(4)
        self.word = numpy.frombuffer(self.mem, numpy.uint32, 1)
        self.word[0] = 0
        self.kernel = cupy.RawKernel(self.SRC, "vgpu_word_linger")

    def start(self, stream, cycles):
        gen = int(self.word[0])
        with self.cupy.cuda.ExternalStream(stream.cuda_stream):
            self.kernel((1,), (1,), (self.numpy.uint64(self.mem.ptr), self.numpy.uint32(gen), self.numpy.int64(cycles)))

    def stop(self):
        self.word[0] = (int(self.word[0]) + 1) & 0xFFFFFFFF


def graph():
    use_torch()
    import torchvision
    model = torchvision.models.resnet50().cuda().eval().half()
    x = torch.randn(1, 3, 224, 224, device="cuda", dtype=torch.half)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        y = model(x)

    side = []  # the linger experiment's stream, made on its first use: the plain replay makes none
    done = []  # sync="event": the event the replay's end is recorded into
    ended = []  # linger_end pre/post: the word-ended spin (word_linger), made on its first use

    def step(start=None, end=None, linger_cycles=0, sync="device", linger_end="fixed"):
        # sync: how the result is waited for: "device" (torch.cuda.synchronize, a context
        # synchronize), "stream" (a stream synchronize of the replay's stream) or "event" (an
        # event recorded after the replay). Services wait in each of these ways.
        # Events around the replay (optional) time the request's own stretch on the GPU.
        # linger_end (with linger_cycles): "fixed", the spin runs its length; "pre" / "post", the
        # next request ends it by moving a word of pinned memory before / after its replay is
        # queued (what a hook can do at a launch; session 24's hook linger ended it so).
        if linger_cycles and linger_end != "fixed" and not ended:
            ended.append(word_linger())
        if ended and linger_end == "pre":
            ended[0].stop()
        if start is not None:
            start.record()
        g.replay()
        if end is not None:
            end.record()
        if ended and linger_end == "post":
            ended[0].stop()
        if linger_cycles and end is not None:
            # An experiment (service.py LINGER_US): a one-thread spin on a side stream from the
            # request's end keeps this context on the GPU a while; wait for the request only.
            if not side:
                side.append(torch.cuda.Stream())
            side[0].wait_event(end)
            if ended:
                ended[0].start(side[0], linger_cycles)
            else:
                with torch.cuda.stream(side[0]):
                    torch.cuda._sleep(linger_cycles)
            end.synchronize()
        elif sync == "stream":
            torch.cuda.current_stream().synchronize()
        elif sync == "event":
            if end is None:
                if not done:
                    done.append(torch.cuda.Event())
                end = done[0]
                end.record()
            end.synchronize()
        else:
            torch.cuda.synchronize()
        return y
    return step


def eager():
    use_torch()
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).cuda().eval().half()
    x = torch.randint(0, 50257, (1, 64), device="cuda")

    def step():
        with torch.no_grad():
            model(x)
        torch.cuda.synchronize()
    return step


def compiled():
    use_torch()
    layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True).cuda()
    model = torch.compile(layer)
    x = torch.randn(16, 512, 1024, device="cuda")
    return training(lambda: model(x).float().pow(2).mean(), torch.optim.AdamW(layer.parameters(), lr=1e-4))


def jax_mlp():
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    key = jax.random.PRNGKey(0)
    sizes = [2048, 8192, 8192, 2048]
    params = [jax.random.normal(k, (a, b), jnp.bfloat16) * 0.02
              for k, a, b in zip(jax.random.split(key, 3), sizes, sizes[1:])]
    x = jax.random.normal(key, (4096, sizes[0]), jnp.bfloat16)
    y = jax.random.normal(key, (4096, sizes[-1]), jnp.bfloat16)

    def loss(ps):
        h = x
        for w in ps[:-1]:
            h = jax.nn.gelu(h @ w)
        return jnp.mean(((h @ ps[-1]) - y).astype(jnp.float32) ** 2)

    @jax.jit
    def update(ps):
        v, g = jax.value_and_grad(loss)(ps)
        return [p - 1e-3 * gp for p, gp in zip(ps, g)], v

    state = [params]
    SYNC.append(lambda: jax.block_until_ready(state[0]))

    def step():
        state[0], v = update(state[0])
        float(v)  # the loss read back, as a training loop logs it
    return step


def cupy_loop():
    import cupy as cp
    a = cp.random.rand(4096, 4096, dtype=cp.float32)
    b = cp.random.rand(4096, 4096, dtype=cp.float32)
    axpb = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * 0.5f + sinf(y)", "axpb")
    SYNC.append(cp.cuda.Device().synchronize)
    i = [0]

    def step():
        c = a @ b
        d = axpb(c, a)
        float(d[:64, :64].sum()) if i[0] % 10 == 9 else d.sum()
        i[0] += 1
    return step


KINDS = dict(matmul=matmul, gpt2=gpt2, resnet=resnet, graph=graph, eager=eager, compile=compiled, jax=jax_mlp, cupy=cupy_loop)


def profiled(kind, steps, warmup, cpu=False):
    """Run `warmup` steps of a torch KIND, then profile `steps` more (CUDA activity, and the host's
    with `cpu`) and return the torch.profiler object (bench/py/kernel_profile.py, step_trace.py)."""
    step = KINDS[kind]()
    for _ in range(warmup):
        step()
    SYNC[0]()
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if cpu else [])) as prof:
        for _ in range(steps):
            step()
        SYNC[0]()
    return prof


STEP_TIMES = bool(os.environ.get("STEP_TIMES"))  # a line at every step's end (dip_probe.py's logs)


def main():
    kind = sys.argv[1]
    secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else float("inf")
    step = KINDS[kind]()
    for _ in range(5):  # warm-up: allocator, cuBLAS/cuDNN autotuning, compilation
        step()
    SYNC[0]()
    n, t0 = 0, time.monotonic()
    last = 0.0
    while time.monotonic() - t0 < secs:
        step()
        n += 1
        now = time.monotonic()
        if STEP_TIMES:
            print(f"step t={now:.4f}", flush=True)
        if now - last >= 0.25:
            print(f"progress t={now:.4f} n={n}", flush=True)
            last = now


if __name__ == "__main__":
    main()
