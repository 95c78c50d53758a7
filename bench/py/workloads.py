"""Real framework workloads for the compute-share benchmark (bench/py/share.py).

usage: workloads.py KIND [--seconds S]
  matmul   PyTorch bf16 8192^3 matmul loop (cuBLAS), synchronize every 10
  gpt2     GPT-2 124M training from GPT2Config() (random weights), bf16 autocast, AdamW, 8x512
  resnet   torchvision ResNet-50 training on random data, batch 64, bf16 autocast, SGD
  graph    batch-1 ResNet-50 inference replayed from a CUDA graph, synchronize each request
  compile  a torch.compile'd transformer block (Triton kernels) training step
Prints `progress t=<time.monotonic()> n=<steps>` about every 250 ms (after warm-up), until
killed or S seconds pass (default: forever).
"""
import sys
import time

import torch


def matmul():
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
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config()).cuda()
    x = torch.randint(0, 50257, (8, 512), device="cuda")
    return training(lambda: model(x, labels=x).loss, torch.optim.AdamW(model.parameters(), lr=1e-4))


def resnet():
    import torchvision
    model = torchvision.models.resnet50().cuda()
    x = torch.randn(64, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (64,), device="cuda")
    lossf = torch.nn.CrossEntropyLoss()
    return training(lambda: lossf(model(x), y), torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))


def graph():
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

    def step():
        g.replay()
        torch.cuda.synchronize()
        return y
    return step


def compiled():
    layer = torch.nn.TransformerEncoderLayer(d_model=1024, nhead=16, dim_feedforward=4096, batch_first=True).cuda()
    model = torch.compile(layer)
    x = torch.randn(16, 512, 1024, device="cuda")
    return training(lambda: model(x).float().pow(2).mean(), torch.optim.AdamW(layer.parameters(), lr=1e-4))


KINDS = dict(matmul=matmul, gpt2=gpt2, resnet=resnet, graph=graph, compile=compiled)


def main():
    kind = sys.argv[1]
    secs = float(sys.argv[sys.argv.index("--seconds") + 1]) if "--seconds" in sys.argv else float("inf")
    step = KINDS[kind]()
    for _ in range(5):  # warm-up: allocator, cuBLAS/cuDNN autotuning, compilation
        step()
    torch.cuda.synchronize()
    n, t0 = 0, time.monotonic()
    last = 0.0
    while time.monotonic() - t0 < secs:
        step()
        n += 1
        now = time.monotonic()
        if now - last >= 0.25:
            print(f"progress t={now:.4f} n={n}", flush=True)
            last = now


if __name__ == "__main__":
    main()
