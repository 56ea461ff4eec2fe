import random

import torch

from hiergraph.ops.topk import top_k_per_group


def test_top_k_per_group_matches_a_per_group_sort():
    rng = random.Random(0)
    for _ in range(20):
        m = rng.randint(0, 30)
        group = torch.tensor([rng.randrange(5) for _ in range(m)], dtype=torch.long)
        scores = torch.tensor([float(rng.randrange(4)) for _ in range(m)])  # many ties
        for k in (0, 1, 2, 7):
            chosen = top_k_per_group(scores, group, k)
            expected = torch.zeros(m, dtype=torch.bool)
            for g in set(group.tolist()):
                members = sorted((group == g).nonzero().view(-1).tolist(), key=lambda i: -scores[i])
                expected[members[:k]] = True  # sorted() is stable: ties keep the lower index
            assert torch.equal(chosen, expected)
