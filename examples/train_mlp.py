"""A small PyTorch training run under msmemscope: an MLP on random data, a
few steps with Adam. Run it under the CLI (``make demo`` does):

    msmemscope --collect-mode=deferred --events=alloc,free,launch,access \\
        --analysis=decompose,inefficient python examples/train_mlp.py

It collects between start() and stop(): every aten operator (forward,
backward, optimizer) with its tensor accesses, tensor blocks as PTA rows
with owners, a SNAPSHOT per step; the decompose and inefficient summaries
are printed when the files are written.
"""
import torch

import msmemscope

torch.manual_seed(0)


def main(steps=3):
    msmemscope.start()
    with msmemscope.describe(owner="model"):
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(steps):
        x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print("step %d loss %.4f" % (step + 1, loss.item()))
        msmemscope.step()
    msmemscope.stop()
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    print("parameters: %d bytes; Adam state: %d bytes" % (params, sum(
        v.untyped_storage().nbytes() for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor))))


if __name__ == "__main__":
    main()
