"""One CPU training loop on a named model (an MLP of three 1024-wide layers,
batch 256, Adam), timed per step. Mode (argv[1]):
  bare       nothing else
  msmemscope msmemscope.start()/stop() around the loop (run it under the CLI
             with the events to measure)
  profiler   torch.profiler.profile(profile_memory=True, record_shapes=True)
Prints one JSON line: mode, steps, median and min seconds per step, and the
aten operators one step launches."""
import json
import statistics
import sys
import time

import torch

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
torch.manual_seed(0)
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                            torch.nn.ReLU(), torch.nn.Linear(1024, 1024))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(256, 1024), torch.randn(256, 1024)


def step():
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()


for _ in range(3):  # warm-up: Adam's state, allocator, kernels
    step()

ops = 0
if mode == "bare":
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            global ops
            ops += 1
            return func(*args, **(kwargs or {}))
    with Count():
        step()

times = []
if mode == "msmemscope":
    import msmemscope
    msmemscope.start()
if mode == "profiler":
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True)
    prof.__enter__()
for _ in range(steps):
    t = time.perf_counter()
    step()
    times.append(time.perf_counter() - t)
if mode == "profiler":
    prof.__exit__(None, None, None)
if mode == "msmemscope":
    msmemscope.stop()
print(json.dumps({"mode": mode, "steps": steps, "median": statistics.median(times), "min": min(times), "ops": ops}))
