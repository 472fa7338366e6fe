"""The RL policy network: small, permutation-equivariant over operators.

One MLP encodes each operator (its features plus the global ones); from the
encodings and their mean/max pool come a "one more slot" and a "one fewer slot"
logit per operator, a "hold" logit, and the value. Padded operators and masked
actions get a large negative logit. The same ``PerOpPolicyNet`` is trained
inside RLlib (wrapped by ``rl.TunerRLModule``) and shipped as a plain torch
``state_dict`` for inference, so acting needs neither RLlib nor a checkpoint.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrm_platform.tuner.actions import K_MAX, N_ACTIONS
from dlrm_platform.tuner.features import F, G

NEG = -1e9


def _mlp(i: int, h: int, o: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(i, h), nn.Tanh(), nn.Linear(h, o))


class PerOpPolicyNet(nn.Module):
    def __init__(self, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.op_enc = nn.Sequential(nn.Linear(F + G, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.op_head = _mlp(2 * hidden, hidden, 2)
        self.hold_head = _mlp(G + 2 * hidden, hidden, 1)
        self.value_head = _mlp(G + 2 * hidden, hidden, 1)
        with torch.no_grad():  # start near-uniform
            self.op_head[-1].weight.mul_(0.01)
            self.hold_head[-1].weight.mul_(0.01)

    def split(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b = obs.shape[0]
        per_op = obs[:, : K_MAX * F].reshape(b, K_MAX, F)
        glob = obs[:, K_MAX * F : K_MAX * F + G]
        mask = obs[:, K_MAX * F + G : K_MAX * F + G + N_ACTIONS]
        return per_op, glob, mask

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked logits [B, N_ACTIONS] and values [B]."""
        per_op, glob, mask = self.split(obs)
        valid = per_op[:, :, 0:1]                                  # [B, K, 1]
        x = torch.cat([per_op, glob.unsqueeze(1).expand(-1, K_MAX, -1)], dim=-1)
        enc = self.op_enc(x) * valid                               # [B, K, H]
        count = valid.sum(1).clamp(min=1.0)
        mean = enc.sum(1) / count
        mx = (enc + (valid - 1.0) * 1e4).max(1).values * (count > 0).float()
        pooled = torch.cat([mean, mx], dim=-1)                     # [B, 2H]
        op_logits = self.op_head(torch.cat([enc, mean.unsqueeze(1).expand(-1, K_MAX, -1)], dim=-1))
        g = torch.cat([glob, pooled], dim=-1)
        hold = self.hold_head(g)                                   # [B, 1]
        logits = torch.cat([hold, op_logits[:, :, 0], op_logits[:, :, 1]], dim=-1)
        logits = torch.where(mask > 0.5, logits, torch.full_like(logits, NEG))
        value = self.value_head(g).squeeze(-1)
        return logits, value
