# A script that builds a model and then fails before any forward call,
# as a broken data pipeline would.
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
raise ValueError("bad batch in data loader")
