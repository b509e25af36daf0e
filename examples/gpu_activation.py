"""The GPU-activation workflow, end to end; runs anywhere (device_map='cpu' without a GPU).

python examples/gpu_activation.py
"""

import torch

import ptexec
import ptexec.export


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 64), torch.nn.Linear(64, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


net = Net().eval()
x = torch.randn(8, 16)

# 1. Export: activations planned on cuda:0, inputs and outputs left to the caller (no GPU needed).
data = ptexec.export.to_pte(net, (x,), device="cuda:0")

# 2. Load: the file says where everything lives.
prog = ptexec.load(data)
meta = prog.method_meta("forward")
print("input: ", meta.inputs[0])  # float32[8, 16] on cuda:0, not planned: the caller's memory
print("buffer:", meta.buffers[0])  # buffer 1: ... bytes on cuda:0

# 3. Call with tensors where the program wants them: shared, zero copies.
device = "cuda:0" if torch.cuda.is_available() else "cpu"
fwd = prog.load_method("forward", device_map=None if device != "cpu" else "cpu")
(y,) = fwd(x.to(device))
print("output:", y.shape, y.device)
print("call:  ", fwd.last_call)  # inputs=['share'], no bytes copied
torch.testing.assert_close(y.cpu(), net(x), rtol=1e-4, atol=1e-5)
