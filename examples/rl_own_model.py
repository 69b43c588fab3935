"""Your own task and your own torch model, trained by nobubble's fully-async GRPO.

The task is any object with prompts, a verifier and room for the answer; the policy is any
causal LM (here torch's own TransformerEncoder) built by a factory that gets the vocabulary
size and the longest sequence. Run it as a script (the workers are spawned processes):

    python examples/rl_own_model.py --steps 200
"""

import argparse

import torch
from torch import nn

from nobubble.rl import RunConfig, train


class Reverse:
    """Write the two letters before "=" backwards; reward = the correct prefix."""

    max_new_tokens = 3  # two letters and <eos>

    def prompts(self):
        return [a + b + "=" for a in "abcd" for b in "abcd"]

    def eval_prompts(self):
        return self.prompts()

    def answer(self, prompt):
        return prompt[1::-1]

    def reward(self, prompt, response):
        want, right = self.answer(prompt), 0
        while right < min(len(want), len(response)) and want[right] == response[right]:
            right += 1
        return right / len(want) - 0.5 * (len(response) > len(want))


class TinyLM(nn.Module):
    """input_ids (B, T) -> logits (B, T, V): embeddings, 2 causal layers, a head."""

    def __init__(self, vocab_size, max_seq_len, hidden=64):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, hidden), nn.Embedding(max_seq_len, hidden)
        layer = nn.TransformerEncoderLayer(hidden, 4, 4 * hidden, dropout=0.0, batch_first=True)
        self.body, self.head = nn.TransformerEncoder(layer, 2), nn.Linear(hidden, vocab_size)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(t)
        x = self.tok(input_ids) + self.pos(torch.arange(t))
        return self.head(self.body(x, mask=causal, is_causal=True))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    cfg = RunConfig(task=Reverse(), policy=TinyLM, mode="fully-async", steps=args.steps,
                    batch_groups=8, group_size=16, eval_every=25)  # fmt: skip
    res = train(cfg)
    print(f"accuracy {res.initial_accuracy:.2f} -> {res.final_accuracy:.2f} in {res.steps} steps,"
          f" {res.samples_per_s:.0f} samples/s, ledger ok: {res.ledger.ok}")  # fmt: skip
