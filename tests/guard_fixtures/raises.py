import torch

torch.ones(3).add(1)
raise ValueError("the script's own error")
