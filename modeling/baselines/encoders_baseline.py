"""The sentence encoders of the classic baselines (``config.encoder_type``; the models are in
``modeling_baseline.py``), each mapping the word vectors of a sentence to token states and one sentence vector:

* ``"cbow"`` / ``"fasttext"`` -- a bag of words: the mean of the word vectors (:class:`BagOfWordsEncoder`; the two
  differ only in their word vectors).
* ``"cnn"`` -- Kim (2014), "Convolutional Neural Networks for Sentence Classification": filters of widths
  3/4/5 with 100 feature maps each over the word vectors, ReLU, max-over-time pooling; static, non-static
  or multichannel embeddings (``embedding_mode``).
* ``"rnn"`` -- an LSTM or GRU, uni- or bidirectional, stacked, with max / mean / attention pooling over
  its states (the GLUE baseline: a 2-layer BiLSTM with max pooling).
* ``"treelstm"`` -- the binary (N-ary, N = 2) Tree-LSTM of Tai et al. (2015), "Improved Semantic
  Representations From Tree-Structured LSTM Networks", eq. 9-14: over a given binary tree (``tree_merges``)
  or over a latent tree composed bottom-up, each step merging the adjacent pair chosen by a
  straight-through Gumbel-softmax over the candidate parents' scores (Choi et al. 2018, "Learning to
  Compose Task-Specific Tree Structures"). The root's hidden state is the sentence vector. The tree parser
  (:func:`parse_binary_tree`) reads a bracketed binary tree into its words and merges.

Imports only torch and the sibling files ``configuration_baseline`` and ``modeling_elmo`` (remote code).
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_baseline import SesameBaselineConfig
from .modeling_elmo import _nonempty

# --------------------------------------------------------------------------------------------------------------
# Encoders: (x (B, W, E), mask (B, W) bool) -> (token states (B, W, H), sentence vector (B, D)), in two steps:
# ``states(x, mask)`` and ``pool(states, mask, x)``; ``token_states`` says whether the states are more than the word
# vectors (the RNN's states, the Tree-LSTM's leaves), i.e. a hidden state of their own.


def masked_pool(h: torch.Tensor, mask: torch.Tensor, kind: str, scorer: nn.Module | None = None) -> torch.Tensor:
    """Pool ``h (B, W, H)`` over the positions of ``mask (B, W)`` bool: ``"max"``, ``"mean"`` or
    ``"attention"`` (``softmax(scorer(h))``-weighted sum). A row with no position gives 0 (``h`` is 0 there)."""
    m = _nonempty(mask)
    if kind == "mean":
        return (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1).to(h.dtype)
    if kind == "attention":
        scores = scorer(h).squeeze(-1).masked_fill(~m, float("-inf"))
        return (torch.softmax(scores, dim=-1).unsqueeze(-1) * h).sum(1)
    return h.masked_fill(~m.unsqueeze(-1), float("-inf")).amax(1)


class _Encoder(nn.Module):
    """An encoder's ``forward(x, mask, *extra) -> (states, pool(states, mask, x, *extra))`` (``extra``: the
    Tree-LSTM's ``tree_merges``)."""

    def forward(self, x, mask, *extra):
        h = self.states(x, mask)
        return h, self.pool(h, mask, x, *extra)


class BagOfWordsEncoder(_Encoder):
    """CBoW / fastText: the mean of the word vectors (Joulin et al. 2017)."""

    token_states = False

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        self.output_size = config.encoder_input_size

    def states(self, x, mask):
        return x

    def pool(self, states, mask, x):
        return masked_pool(states, mask, "mean")


class KimCNNEncoder(nn.Module):
    """Kim (2014): for each width ``w`` in ``cnn_filter_sizes``, ``cnn_num_filters`` filters over windows of ``w``
    word vectors (the sentence padded with ``w - 1`` zero vectors on both sides, so that a sentence shorter than
    ``w`` still has windows), ReLU, max over the windows that hold at least one word. Multichannel: each filter
    is applied to both channels and the results added (one bias)."""

    token_states = False

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        self.widths = list(config.cnn_filter_sizes)
        self.convs = nn.ModuleList(
            nn.Conv1d(config.encoder_input_size, config.cnn_num_filters, w, padding=w - 1) for w in self.widths
        )
        self.output_size = config.cnn_num_filters * len(self.widths)

    def states(self, x, mask):
        return x[-1] if x.dim() == 4 else x  # the (fine-tuned) word vectors

    def pool(self, states, mask, x):
        return self(x, mask)[1]

    def forward(self, x, mask):
        channels = x if x.dim() == 4 else x.unsqueeze(0)
        lengths = mask.sum(1)
        pooled = []
        for w, conv in zip(self.widths, self.convs):
            c = conv(channels[-1].transpose(1, 2))
            for extra in channels[:-1]:  # the static channel: the same filters, no second bias
                c = c + F.conv1d(extra.transpose(1, 2), conv.weight, padding=w - 1)
            c = torch.relu(c)  # (B, F, W + w - 1): window p covers words p - w + 1 .. p
            valid = torch.arange(c.shape[-1], device=c.device).unsqueeze(0) < (lengths + w - 1).clamp(min=w).unsqueeze(
                1
            )
            pooled.append(c.masked_fill(~valid.unsqueeze(1), float("-inf")).amax(-1))
        return channels[-1], torch.cat(pooled, dim=-1)


class RNNEncoder(_Encoder):
    """A stacked (bi)LSTM / GRU over the words (packed sequences: padding never enters a state), pooled by
    ``pooling`` (max / mean / attention with a learned scorer). Under ``torch.export`` the recurrence runs as torch's
    ``scan`` over the steps (:func:`_scan_rnn`: the same function; ``nn.LSTM`` would fix the sequence length)."""

    token_states = True

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        rnn = nn.LSTM if config.rnn_type == "lstm" else nn.GRU
        self.rnn = rnn(
            config.encoder_input_size,
            config.rnn_hidden_size,
            num_layers=config.rnn_num_layers,
            bidirectional=config.rnn_bidirectional,
            batch_first=True,
            dropout=config.rnn_dropout if config.rnn_num_layers > 1 else 0.0,
        )
        self.output_size = config.rnn_hidden_size * (2 if config.rnn_bidirectional else 1)
        self.pooling = config.pooling
        self.scorer = (
            nn.Sequential(
                nn.Linear(self.output_size, self.output_size), nn.Tanh(), nn.Linear(self.output_size, 1, bias=False)
            )
            if config.pooling == "attention"
            else None
        )

    def states(self, x, mask):
        if torch.compiler.is_exporting():
            h = _scan_rnn(self.rnn, x, mask.sum(1))
        else:
            lengths = mask.sum(1).clamp(min=1).cpu()
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, _ = self.rnn(packed)
            h, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
        return h * mask.unsqueeze(-1)

    def pool(self, states, mask, x):
        return masked_pool(states, mask, self.pooling, self.scorer)


def _scan_rnn(rnn: nn.LSTM | nn.GRU, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``rnn`` (``batch_first``, any layers and directions, no projection) over the right-padded sequences ``x (B, W,
    E)`` of ``lengths (B,)`` as packed sequences would give it at the valid positions, with torch's ``scan`` over the
    steps (``torch.export``: the length stays symbolic; ONNX ``Scan``): each direction's cell is PyTorch's own
    (``torch.lstm_cell`` / ``torch.gru_cell``) with the module's parameters, the reverse direction reads each sequence
    backwards within its length, dropout between layers as the module's. Returns ``(B, W, directions * H)``."""
    from torch._higher_order_ops.scan import scan

    b, w = x.shape[:2]
    pos = torch.arange(w, device=x.device).expand(b, w)
    n = lengths.unsqueeze(1)
    backwards = torch.where(pos < n, n - 1 - pos, pos).unsqueeze(-1)  # an involution

    def run(inputs, names):
        # the weights are read from the module inside the steps: a tensor a scan body closes over gets symbolic sizes,
        # which torch.export may unify with the batch or the length (duck sizing) and then fix
        if isinstance(rnn, nn.LSTM):

            def step(state, xt):
                h, c = torch.lstm_cell(xt, state, *(getattr(rnn, name) for name in names))
                return (h, c), h.clone()  # scan's outputs may not alias its carry

            init = (inputs.new_zeros(b, rnn.hidden_size), inputs.new_zeros(b, rnn.hidden_size))  # two tensors: no alias
        else:

            def step(h, xt):
                h = torch.gru_cell(xt, h, *(getattr(rnn, name) for name in names))
                return h, h.clone()

            init = inputs.new_zeros(b, rnn.hidden_size)
        # contiguous: scan traces a view's base too, and its sizes' symbols can pin the batch and length to the example
        return scan(step, init, inputs.transpose(0, 1).contiguous())[1].transpose(0, 1)

    for layer in range(rnn.num_layers):
        outs = []
        for suffix in ("", "_reverse")[: 1 + rnn.bidirectional]:
            names = [f"{name}_l{layer}{suffix}" for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            if suffix:
                flip = backwards.expand(-1, -1, x.shape[-1])
                outs.append(run(x.gather(1, flip), names).gather(1, backwards.expand(-1, -1, rnn.hidden_size)))
            else:
                outs.append(run(x, names))
        x = torch.cat(outs, dim=-1)
        if layer < rnn.num_layers - 1:
            x = F.dropout(x, rnn.dropout, rnn.training)
    return x


class BinaryTreeLSTMCell(nn.Module):
    """Tai et al. (2015) binary Tree-LSTM unit (eq. 9-14, N = 2): from children ``(h_l, c_l)``, ``(h_r, c_r)``,
    ``[i; f_l; f_r; o; u] = W [h_l; h_r] + b``, ``c = sigmoid(i) * tanh(u) + sigmoid(f_l) * c_l + sigmoid(f_r) *
    c_r``, ``h = sigmoid(o) * tanh(c)``. Shapes ``(..., H)``. Forget biases start at 1."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.linear = nn.Linear(2 * hidden_size, 5 * hidden_size)
        self.linear.bias_fill = (hidden_size, 3 * hidden_size, 1.0)  # forget gates f_l, f_r: read by _init_weights

    def forward(self, hl, cl, hr, cr):
        i, fl, fr, o, u = self.linear(torch.cat([hl, hr], dim=-1)).chunk(5, dim=-1)
        c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr
        return torch.sigmoid(o) * torch.tanh(c), c


def parse_binary_tree(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Read a bracketed binary tree into its words and its merges.

    Accepts unlabelled trees ``"((the cat) (sat down))"`` and labelled ones in the Stanford Sentiment Treebank
    style ``"(3 (2 the) (3 (2 cat) (2 sat)))"`` (a group whose first element is an integer followed by
    something is read as labelled; labels are dropped). Unary groups collapse to their child.

    Returns:
        ``(words, merges)``: nodes ``0..n-1`` are the words; merge ``k`` is ``(left, right)`` and creates node
        ``n + k``; the last merge is the root. A one-word tree has no merge.

    Raises:
        ValueError: unbalanced parentheses, an empty group or a node with more than two children.
    """
    tokens = re.findall(r"\(|\)|[^\s()]+", text)
    pos = 0

    def group():
        nonlocal pos
        if tokens[pos] != "(":
            pos += 1
            return tokens[pos - 1]
        pos += 1
        items = []
        while pos < len(tokens) and tokens[pos] != ")":
            items.append(group())
        if pos >= len(tokens):
            raise ValueError(f"unbalanced parentheses in the tree {text!r}")
        pos += 1
        if len(items) >= 2 and isinstance(items[0], str) and re.fullmatch(r"-?\d+", items[0]):
            items = items[1:]
        if not items or len(items) > 2:
            raise ValueError(f"tree {text!r}: a node with {len(items)} children; expected a binary tree")
        return items[0] if len(items) == 1 else (items[0], items[1])

    if not tokens:
        raise ValueError("empty tree")
    tree = group()
    if pos != len(tokens):
        raise ValueError(f"unbalanced parentheses in the tree {text!r}")
    words: list[str] = []

    def leaves(node):
        if isinstance(node, str):
            words.append(node)
            return
        leaves(node[0])
        leaves(node[1])

    leaves(tree)
    merges: list[tuple[int, int]] = []
    counter = iter(range(len(words)))

    def number(node) -> int:
        if isinstance(node, str):
            return next(counter)
        left, right = number(node[0]), number(node[1])
        merges.append((left, right))
        return len(words) + len(merges) - 1

    number(tree)
    return words, merges


class TreeLSTMEncoder(_Encoder):
    """Binary Tree-LSTM over given or latent trees; the sentence vector is the root's ``h``.

    Leaves: ``c = W_c x``, ``h = sigmoid(W_o x) * tanh(c)`` (Choi et al. 2018's leaf transformation).
    Latent trees (Choi et al. 2018): while a sentence has more than one node, every adjacent pair is composed
    into a candidate parent, scored ``q . h_parent``; in training the pair is chosen by a straight-through
    Gumbel-softmax (``gumbel_temperature``: the forward pass uses the one-hot argmax of the perturbed scores,
    the backward pass the gradient of their softmax), in evaluation by the argmax; the chosen parent replaces
    the pair. Given trees: ``tree_merges (B, W - 1, 2)`` long, merge ``k`` of row ``b`` composing nodes
    ``(left, right)`` into node ``n_b + k`` (``n_b`` words, nodes ``0..n_b-1`` the words in order), rows padded
    with -1; the root is the last merge (``parse_binary_tree`` writes this form).
    """

    def __init__(self, config: SesameBaselineConfig):
        super().__init__()
        h = config.treelstm_hidden_size
        self.leaf = nn.Linear(config.encoder_input_size, 2 * h)
        self.cell = BinaryTreeLSTMCell(h)
        self.query = nn.Parameter(torch.zeros(h))
        self.output_size = h
        self.temperature = config.gumbel_temperature
        self.tree_source = config.tree_source

    def leaves(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c, o = self.leaf(x).chunk(2, dim=-1)
        return torch.sigmoid(o) * torch.tanh(c), c

    token_states = True

    def states(self, x, mask):
        """The leaves' ``h (B, W, H)``, 0 at padding (a leaf of a padding "word" is not 0 once its bias is trained)."""
        return self.leaves(x)[0] * mask.unsqueeze(-1).to(x.dtype)

    def pool(self, states, mask, x, tree_merges: torch.Tensor | None = None):
        """The root's ``h (B, H)``, composed from the leaves ``states (B, W, H)`` (their cells recomputed from the word
        vectors ``x (B, W, E)``) over ``tree_merges`` or a latent tree.

        Raises:
            ValueError: ``tree_source='given'`` without ``tree_merges``, or too few merges for a sentence.
        """
        c = self.leaves(x)[1]
        lengths = mask.sum(1)
        if tree_merges is not None:
            return self.compose_given(states, c, lengths, tree_merges)
        if self.tree_source == "given":
            raise ValueError("SesameBaselineConfig.tree_source='given' but no tree_merges were passed")
        return self.compose_latent(states, c, lengths)

    def compose_given(self, h, c, lengths, merges) -> torch.Tensor:
        b, w = h.shape[:2]
        if merges.shape[1] < w - 1 and bool((lengths > merges.shape[1] + 1).any()):
            raise ValueError(
                f"tree_merges has {merges.shape[1]} merges per row; a sentence has {int(lengths.max())} words"
            )
        nodes_h = torch.cat([h, h.new_zeros(b, max(merges.shape[1], 1), h.shape[-1])], dim=1)
        nodes_c = torch.cat([c, c.new_zeros(b, max(merges.shape[1], 1), c.shape[-1])], dim=1)
        rows = torch.arange(b, device=h.device)
        for k in range(merges.shape[1]):
            left, right = merges[:, k, 0], merges[:, k, 1]
            active = left >= 0
            if not bool(active.any()):
                continue
            li, ri = left.clamp(min=0), right.clamp(min=0)
            ph, pc = self.cell(nodes_h[rows, li], nodes_c[rows, li], nodes_h[rows, ri], nodes_c[rows, ri])
            target = (lengths + k).clamp(max=nodes_h.shape[1] - 1)
            keep = active.unsqueeze(-1)
            nodes_h = nodes_h.index_put((rows, target), torch.where(keep, ph, nodes_h[rows, target]))
            nodes_c = nodes_c.index_put((rows, target), torch.where(keep, pc, nodes_c[rows, target]))
        root = torch.where(lengths > 1, lengths + (lengths - 2).clamp(min=0), torch.zeros_like(lengths))
        root = root.clamp(max=nodes_h.shape[1] - 1)
        return nodes_h[rows, root] * (lengths > 0).unsqueeze(-1)

    def compose_latent(self, h, c, lengths) -> torch.Tensor:
        for t in range(h.shape[1] - 1):
            ph, pc = self.cell(h[:, :-1], c[:, :-1], h[:, 1:], c[:, 1:])  # candidates (B, W - t - 1, H)
            pairs = torch.arange(ph.shape[1], device=h.device).unsqueeze(0) < (lengths - t - 1).unsqueeze(1)
            done = ~pairs.any(dim=1)  # rows already reduced to one node (or empty)
            scores = (ph * self.query).sum(-1).float().masked_fill(~pairs, float("-inf"))
            scores = scores.masked_fill(done.unsqueeze(1), 0.0)
            if self.training:  # straight-through Gumbel-softmax (Jang et al. 2017)
                select = F.gumbel_softmax(scores, tau=self.temperature, hard=True)
            else:
                select = F.one_hot(scores.argmax(-1), ph.shape[1]).float()
            select = select.to(ph.dtype)
            cum = select.cumsum(1)
            left, right = (1 - cum).unsqueeze(-1), (cum - select).unsqueeze(-1)
            sel = select.unsqueeze(-1)
            new_h = left * h[:, :-1] + sel * ph + right * h[:, 1:]
            new_c = left * c[:, :-1] + sel * pc + right * c[:, 1:]
            d = done.view(-1, 1, 1)
            h = torch.where(d, h[:, :-1], new_h)
            c = torch.where(d, c[:, :-1], new_c)
        return h[:, 0] * (lengths > 0).unsqueeze(-1)


#: encoder_type -> encoder class (fastText differs from CBoW only in its word vectors).
ENCODERS = {
    "cbow": BagOfWordsEncoder,
    "fasttext": BagOfWordsEncoder,
    "cnn": KimCNNEncoder,
    "rnn": RNNEncoder,
    "treelstm": TreeLSTMEncoder,
}
