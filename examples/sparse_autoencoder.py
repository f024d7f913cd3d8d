"""A deep denoising autoencoder on bag-of-words-like sparse vectors.

Documents are synthetic: each draws words from a mixture of topics over a
long-tailed vocabulary, and its vector holds a weight for each word it
contains (sparse: a few dozen of several thousand), high for the words
typical of its topics.  The autoencoder reads
a corrupted vector (SDAESparseCriterion hides a share of its words) and is
trained to give back every word's weight, the hidden ones most (alpha) and
the others less (beta).  It never builds a dense (documents, vocabulary)
tensor: the encoder is a SparseLinearBatch and the decoder a
SparseOutputLinear evaluated only at the document's own words.

    python examples/sparse_autoencoder.py [--epochs 10] [--docs 4000] [--vocab 5000]

At the end it prints the error on words hidden from held-out documents,
beside the error of predicting each word's mean weight.
"""
from __future__ import annotations

import argparse
import math
from typing import Dict, List, Optional

import torch
from torch import nn
from tqdm import tqdm

import nnsparse


def make_documents(docs: int, vocab: int, topics: int = 20, length: int = 40,
                   seed: int = 0) -> torch.Tensor:
    """A ``(docs, vocab)`` CSR batch: the words each document contains, weighted.

    Each document draws about ``length`` words from its own mixture of topics
    over a Zipf-like vocabulary; a word's weight is ``sigmoid(PMI / 2)``, its
    pointwise mutual information with the document squashed to (0, 1): high
    for words typical of the document's topics, low for merely common ones.
    """
    g = torch.Generator().manual_seed(seed)
    popularity = 1.0 / torch.arange(1, vocab + 1).double() ** 0.8
    topic_words = torch.rand(topics, vocab, generator=g, dtype=torch.float64) ** 4 * popularity
    topic_words /= topic_words.sum(1, keepdim=True)
    mixture = torch.distributions.Dirichlet(torch.full((topics,), 0.2, dtype=torch.float64))
    p_word_doc = mixture.sample((docs,)) @ topic_words  # (docs, vocab), rows sum to 1
    lengths = torch.poisson(torch.full((docs,), float(length)), generator=g).clamp(min=5).long()
    draws = torch.multinomial(p_word_doc, int(lengths.max()), replacement=True, generator=g)
    keep = torch.arange(draws.shape[1]) < lengths.unsqueeze(1)
    row = torch.arange(docs).unsqueeze(1).expand_as(draws)[keep]
    index = torch.unique(row * vocab + draws[keep])
    row, col = index // vocab, index % vocab
    pmi = torch.log(p_word_doc[row, col] / p_word_doc.mean(0)[col])
    return torch.sparse_coo_tensor(torch.stack([row, col]), torch.sigmoid(pmi / 2).float(),
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


def _batches(data: torch.Tensor, rows: torch.Tensor, batch_size: int):
    for chunk in rows.split(batch_size):
        yield data.index_select(0, chunk) if data.layout == torch.strided else _rows(data, chunk)


def _rows(csr: torch.Tensor, chunk: torch.Tensor) -> torch.Tensor:
    """Rows ``chunk`` of a CSR matrix, as a CSR batch (no densification)."""
    crow, col, val = csr.crow_indices(), csr.col_indices(), csr.values()
    starts, counts = crow[chunk], crow[chunk + 1] - crow[chunk]
    offsets = torch.repeat_interleave(starts - torch.cumsum(counts, 0) + counts, counts)
    take = torch.arange(int(counts.sum())) + offsets
    new_crow = torch.zeros(chunk.shape[0] + 1, dtype=crow.dtype)
    torch.cumsum(counts, 0, out=new_crow[1:])
    return torch.sparse_csr_tensor(new_crow, col[take], val[take], (chunk.shape[0], csr.shape[1]))


def main(argv: Optional[List[str]] = None) -> Dict[str, float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=4000)
    p.add_argument("--vocab", type=int, default=5000)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 64])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hide-ratio", type=float, default=0.25)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--alpha", type=float, default=1.0, help="weight of the hidden words")
    p.add_argument("--beta", type=float, default=0.5, help="weight of the other words")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = p.parse_args(argv)

    torch.manual_seed(args.seed)
    data = make_documents(args.docs, args.vocab, seed=args.seed)
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
        shuffled = train[torch.randperm(train.shape[0])]
        bar = tqdm(list(_batches(data, shuffled, args.batch_size)), desc=f"epoch {epoch}",
                   disable=args.no_progress, leave=False)
        total = 0.0
        for x in bar:
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
        for x in _batches(data, test, 256):
            noisy = hide.prepare_input(x).to_sparse_coo().coalesce()
            est = model(noisy, x).to_sparse_coo().coalesce()
            coo = x.to_sparse_coo().coalesce()
            r, c = coo.indices()
            width = x.shape[1]
            hidden = ~torch.isin(r * width + c, noisy.indices()[0] * width + noisy.indices()[1])
            target = coo.values()[hidden]
            sq_err += float(((est.values()[hidden] - target) ** 2).sum())
            sq_base += float(((word_mean[c[hidden]] - target) ** 2).sum())
            count += int(hidden.sum())
    rmse, base = math.sqrt(sq_err / count), math.sqrt(sq_base / count)
    print(f"word-mean baseline RMSE on hidden words: {base:.4f}")
    print(f"autoencoder RMSE on hidden words: {rmse:.4f}")
    return {"rmse": rmse, "baseline": base}


def _word_means(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    coo = _rows(data, rows).to_sparse_coo().coalesce()
    col, values = coo.indices()[1], coo.values()
    sums = torch.zeros(data.shape[1]).index_add_(0, col, values)
    counts = torch.bincount(col, minlength=data.shape[1]).clamp(min=1)
    return sums / counts


if __name__ == "__main__":
    main()
