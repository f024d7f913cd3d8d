"""A deep denoising autoencoder on bag-of-words-like sparse vectors.

Documents are synthetic: each holds a few dozen words of a long-tailed
vocabulary of thousands, each word with a weight in (0, 1) that depends on
the document's topics (low-rank) and the word.  The autoencoder reads
a corrupted vector (SDAESparseCriterion hides a share of its words) and is
trained to give back every word's weight, the hidden ones most (alpha) and
the others less (beta).  It never builds a dense (documents, vocabulary)
tensor: the encoder is a SparseLinearBatch and the decoder a
SparseOutputLinear evaluated only at the document's own words.

    python examples/sparse_autoencoder.py [--epochs 10] [--docs 10000] [--vocab 1000]

At the end it prints the error on words hidden from held-out documents,
beside the error of predicting each word's mean weight.
"""
from __future__ import annotations

import argparse
import math
from typing import Dict, List, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader, Subset
from tqdm import tqdm

import nnsparse
from nnsparse.data import SparseRowDataset


def make_documents(docs: int, vocab: int, topics: int = 8, length: int = 40,
                   seed: int = 0) -> torch.Tensor:
    """A ``(docs, vocab)`` CSR batch: the words each document contains, weighted.

    Each document holds about ``length`` words drawn from a Zipf-like
    vocabulary; a word's weight in it, in (0, 1), is its affinity with the
    document's topics (a rank-``topics`` product of document and word
    factors), plus a word bias and noise, through a sigmoid.  The weights of a
    document's hidden words are thus predictable from its other words.
    """
    g = torch.Generator().manual_seed(seed)
    popularity = 1.0 / torch.arange(1, vocab + 1).double() ** 0.8
    lengths = torch.poisson(torch.full((docs,), float(length)), generator=g).clamp(min=5).long()
    draws = torch.multinomial(popularity.expand(docs, vocab), int(lengths.max()),
                              replacement=True, generator=g)
    keep = torch.arange(draws.shape[1]) < lengths.unsqueeze(1)
    row = torch.arange(docs).unsqueeze(1).expand_as(draws)[keep]
    index = torch.unique(row * vocab + draws[keep])
    row, col = index // vocab, index % vocab
    doc_factors = torch.randn(docs, topics, generator=g) / topics ** 0.5
    word_factors = torch.randn(vocab, topics, generator=g)
    word_bias = torch.randn(vocab, generator=g) * 0.5
    score = ((doc_factors[row] * word_factors[col]).sum(1) * 1.5 + word_bias[col]
             + 0.3 * torch.randn(row.shape[0], generator=g))
    return torch.sparse_coo_tensor(torch.stack([row, col]), torch.sigmoid(score),
                                   (docs, vocab)).to_sparse_csr()


class DenoisingAutoencoder(nn.Module):
    """sparse input -> SparseLinearBatch -> tanh -> ... -> SparseOutputLinear at the target's words."""

    def __init__(self, vocab: int, hidden: List[int]) -> None:
        super().__init__()
        sizes = [vocab] + hidden
        self.encoder = nnsparse.SparseLinearBatch(vocab, hidden[0])
        middle: List[nn.Module] = []
        for a, b in zip(sizes[1:], sizes[2:] + sizes[-2:0:-1]):
            middle += [nn.Linear(a, b), nn.Tanh()]
        self.middle = nn.Sequential(nn.Tanh(), *middle)
        self.decoder = nnsparse.SparseOutputLinear(hidden[0], vocab)

    def forward(self, x, pattern=None):
        out = self.decoder(self.middle(self.encoder(x)), pattern)
        return nnsparse.values_map(torch.sigmoid, out)


def _batches(dataset: SparseRowDataset, rows: torch.Tensor, batch_size: int,
             shuffle: bool = False) -> DataLoader:
    """CSR batches of the given rows (``nnsparse.data``'s dataset and collate)."""
    return DataLoader(Subset(dataset, rows.tolist()), batch_size=batch_size, shuffle=shuffle,
                      collate_fn=dataset.collate)


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=10000)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--hidden", type=int, nargs="+", default=[128, 32])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hide-ratio", type=float, default=0.5)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=1.0, help="weight of the hidden words")
    p.add_argument("--beta", type=float, default=0.1, help="weight of the other words")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    data = make_documents(args.docs, args.vocab, seed=args.seed)
    dataset = SparseRowDataset(data)
    order = torch.randperm(args.docs)
    n_test = args.docs // 10
    train, test = order[n_test:], order[:n_test]
    model = DenoisingAutoencoder(args.vocab, args.hidden)
    criterion = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=args.alpha, beta=args.beta,
                                             hide_ratio=args.hide_ratio,
                                             generator=torch.Generator().manual_seed(args.seed))
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    for epoch in range(1, args.epochs + 1):
        model.train()
        bar = tqdm(_batches(dataset, train, args.batch_size, shuffle=True),
                   desc=f"epoch {epoch}", disable=args.no_progress, leave=False)
        total = 0.0
        for x, _ in bar:
            noisy = criterion.prepare_input(x)
            loss = criterion(model(noisy, x), x)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
        print(f"epoch {epoch}: train loss {total / len(bar):.5f}")

    # Held-out documents: hide a quarter of each one's words, predict them.
    model.eval()
    hide = nnsparse.SDAESparseCriterion(nn.MSELoss(), hide_ratio=0.25,
                                        generator=torch.Generator().manual_seed(1))
    word_mean = _word_means(data, train)
    sq_err = sq_base = count = 0.0
    with torch.no_grad():
        for x, _ in _batches(dataset, test, 256):
            noisy = hide.prepare_input(x).to_sparse_coo().coalesce()
            est = model(noisy, x).to_sparse_coo().coalesce()
            coo = x.to_sparse_coo().coalesce()
            r, c = coo.indices()
            # prepare_input keeps x's pattern and sets the hidden entries to 0
            hidden = (noisy.values() == 0) & (coo.values() != 0)
            target = coo.values()[hidden]
            sq_err += float(((est.values()[hidden] - target) ** 2).sum())
            sq_base += float(((word_mean[c[hidden]] - target) ** 2).sum())
            count += int(hidden.sum())
    rmse, base = math.sqrt(sq_err / count), math.sqrt(sq_base / count)
    print(f"word-mean baseline RMSE on hidden words: {base:.4f}")
    print(f"autoencoder RMSE on hidden words: {rmse:.4f}")
    return {"rmse": rmse, "baseline": base}


def _word_means(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    coo = data.to_sparse_coo().index_select(0, rows).coalesce()
    col, values = coo.indices()[1], coo.values()
    sums = torch.zeros(data.shape[1]).index_add_(0, col, values)
    counts = torch.bincount(col, minlength=data.shape[1]).clamp(min=1)
    return sums / counts


if __name__ == "__main__":
    main()
