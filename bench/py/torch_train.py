"""Train a small conv net on random data with a fixed batch; report steps/s each second.

usage: torch_train.py [--seconds 10] [--batch 64] [--size 64] [--device D]
Output: params= batch=, each second `second=K steps_per_sec=X`, then total_steps= elapsed_s=
avg_steps_per_sec=. Every step ends with torch.cuda.synchronize() so the rate is the GPU's.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Rate, out  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=10)
ap.add_argument("--batch", type=int, default=64)
ap.add_argument("--size", type=int, default=64, help="image side")
ap.add_argument("--device", type=int, default=0)
args = ap.parse_args()
dev = torch.device("cuda", args.device)


def block(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.MaxPool2d(2))


model = nn.Sequential(block(3, 64), block(64, 128), block(128, 256), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(256, 100)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(args.batch, 3, args.size, args.size, device=dev)
y = torch.randint(0, 100, (args.batch,), device=dev)
loss_fn = nn.CrossEntropyLoss()
out(params=sum(p.numel() for p in model.parameters()), batch=args.batch, image=args.size)

for _ in range(5):  # warm-up (cuDNN autotuning, allocator)
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
torch.cuda.synchronize(dev)

r = Rate("steps")
while True:
    opt.zero_grad(set_to_none=True)
    loss_fn(model(x), y).backward()
    opt.step()
    torch.cuda.synchronize(dev)
    if r.add() >= args.seconds:
        break
r.finish()
