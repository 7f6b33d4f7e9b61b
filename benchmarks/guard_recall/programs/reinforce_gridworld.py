"""REINFORCE with a value baseline on a toy 1-D random walk (pure Python environment)."""
import random

import torch
import torch.nn as nn
import torch.nn.functional as F

random.seed(0)
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class Walk:
    def reset(self):
        self.pos, self.t = 0, 0
        return [0.0, 0.0]

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        self.t += 1
        reward = 1.0 if self.pos == 5 else -0.01
        return [self.pos / 10.0, self.t / 40.0], reward, self.t >= 40


class ActorCritic(nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(2, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, 2)
        self.v = nn.Linear(hidden, 1)

    def forward(self, x):
        h = self.body(x)
        return F.softmax(self.pi(h), dim=-1), self.v(h).squeeze(-1)


def main():
    env, model = Walk(), ActorCritic().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gamma = 0.99
    for episode in range(6):
        state, done = env.reset(), False
        log_probs, values, rewards = [], [], []
        while not done:
            probs, value = model(torch.tensor(state, device=device))
            dist = torch.distributions.Categorical(probs)
            action = dist.sample()
            state, reward, done = env.step(action.item())
            log_probs.append(dist.log_prob(action))
            values.append(value)
            rewards.append(reward)

        returns, R = [], 0.0
        for r in reversed(rewards):
            R = r + gamma * R
            returns.insert(0, R)
        returns = torch.tensor(returns, device=device)
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        values = torch.stack(values)
        advantages = torch.zeros_like(returns)
        for i in range(len(rewards)):
            advantages[i] = returns[i] - values[i].detach()
        policy_loss = -(torch.stack(log_probs) * advantages).sum()
        value_loss = F.smooth_l1_loss(values, returns)
        opt.zero_grad()
        (policy_loss + value_loss).backward()
        opt.step()


if __name__ == "__main__":
    main()
