# A training-like script whose model class lives in __main__ and which has
# no `if __name__ == "__main__":` guard: everything runs at top level.
import torch
import torch.nn as nn
import torch.nn.functional as F

HIDDEN = 96


def apply_act(x, act):
    if act == "silu":
        return F.silu(x)
    if act == "gelu":
        return F.gelu(x)
    return F.relu(x)


class GatedMLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "silu"):
        super().__init__()
        self.act = act
        self.gate = nn.Linear(dim, hidden)
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.down(apply_act(self.gate(x), self.act) * self.up(x))


torch.manual_seed(0)
model = nn.Sequential(GatedMLP(32, HIDDEN), nn.Linear(32, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    x = torch.randn(16, 32)
    y = torch.randint(0, 4, (16,))
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step} loss {loss.item():.4f}")
