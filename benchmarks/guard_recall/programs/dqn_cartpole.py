"""DQN on a toy CartPole-like environment (pure Python dynamics), with a replay buffer."""
import math
import random
from collections import deque

import torch
import torch.nn as nn
import torch.nn.functional as F

random.seed(0)
torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class ToyCartPole:
    def reset(self):
        self.state = [random.uniform(-0.05, 0.05) for _ in range(4)]
        self.t = 0
        return list(self.state)

    def step(self, action):
        x, v, th, w = self.state
        force = 10.0 if action == 1 else -10.0
        acc = (force + 0.05 * w * w * math.sin(th)) / 1.1
        w = w + 0.02 * (9.8 * math.sin(th) - math.cos(th) * acc) / 0.5
        v, x, th = v + 0.02 * acc, x + 0.02 * v, th + 0.02 * w
        self.state = [x, v, th, w]
        self.t += 1
        done = abs(x) > 2.4 or abs(th) > 0.21 or self.t >= 200
        return list(self.state), 1.0, done


class QNet(nn.Module):
    def __init__(self, n_obs=4, n_actions=2, hidden=128):
        super().__init__()
        self.fc1 = nn.Linear(n_obs, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_actions)

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class Agent:
    def __init__(self):
        self.policy = QNet().to(device)
        self.target = QNet().to(device)
        self.target.load_state_dict(self.policy.state_dict())
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=1e-3)
        self.memory = deque(maxlen=10000)
        self.gamma = 0.99
        self.losses = []

    def act(self, state, eps):
        if random.random() < eps:
            return random.randrange(2)
        with torch.no_grad():
            q_values = self.policy(torch.tensor(state, device=device).unsqueeze(0))
        return q_values.argmax(dim=1).item()

    def learn(self, batch_size=64):
        batch = random.sample(self.memory, batch_size)
        states, actions, rewards, next_states, dones = zip(*batch)
        states = torch.tensor(states, dtype=torch.float32).to(device)
        actions = torch.tensor(actions, dtype=torch.long).to(device)
        rewards = torch.tensor(rewards, dtype=torch.float32).to(device)
        next_states = torch.tensor(next_states, dtype=torch.float32).to(device)
        dones = torch.tensor(dones, dtype=torch.bool).to(device)

        q = self.policy(states).gather(1, actions.unsqueeze(1))
        with torch.no_grad():
            next_q = self.target(next_states).max(1)[0]
            next_q[dones] = 0.0
        expected = rewards + self.gamma * next_q
        loss = F.smooth_l1_loss(q, expected)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.losses.append(loss.item())


def main():
    env, agent = ToyCartPole(), Agent()
    state = env.reset()
    for _ in range(64):  # fill the buffer with random play
        action = random.randrange(2)
        next_state, reward, done = env.step(action)
        agent.memory.append((state, action, reward, next_state, done))
        state = env.reset() if done else next_state
    for step in range(10):
        eps = max(0.05, 1.0 - step / 500)
        action = agent.act(state, eps)
        next_state, reward, done = env.step(action)
        agent.memory.append((state, action, reward, next_state, done))
        state = env.reset() if done else next_state
        agent.learn()
        if step % 10 == 0:
            agent.target.load_state_dict(agent.policy.state_dict())


if __name__ == "__main__":
    main()
