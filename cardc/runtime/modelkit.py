"""The helpers of generated models: the KV cache, joined projections, RoPE's tables and
rotations, RMSNorm, joins of values that broadcast, masks made once per sizes, and
grouped-query SDPA.

`cardc build` copies the ones a model uses into its generated file, by name and as written
here (cardc.codegen reads this file as text, never imports it), after the model's classes:
Python resolves their names when the model runs. So each uses torch, F, math and the other
helpers of this module, and nothing else; a module-level name here is one helper.
"""

import math

import torch
import torch.nn.functional as F


class KVCache:
    """The keys and values of the tokens decoded so far, per attention layer, so that
    forward(x, cache=…) reads only the tokens after them. A static cache (`length`) holds them
    in buffers of that many positions made at its first step, and its position is a tensor:
    every decode step then has the same shapes and nothing a trace would specialise on, so
    torch.compile makes one graph for the prefill and one for every decoded token."""

    def __init__(self, joins=None, length=None, device=None):
        self.length, self.device = length, device
        # tokens decoded so far: a number, or a static cache's 0-d tensor
        self.pos = 0 if length is None else torch.zeros((), dtype=torch.long, device=device)
        self.kv = {}  # attention module → its keys and values, (B, heads, pos, d) each
        self.tokens = None  # those tokens, (B, pos), when they came through new()
        self.joins = {} if joins is None else joins  # project's joined weights, by their ids
        self.calls = 0  # attention calls made by this forward so far
        self.called = {}  # {module: n}: its calls by this forward so far
        self.states = {}  # recurrence over positions → the state its last position left
        self.carried = 0  # recurrences resumed by this forward so far
        self.source = self.given = None  # an encoder–decoder's source (a copy; as given),
        # encoded once for its decoded tokens
        self.encoding = ()  # what its encoder made of it that the decoder reads
        self.context = []  # what the decoder's steps made of the encoding (cross keys, values)
        self.contexts = 0  # of them read by this forward so far
        self.room = {}  # layer → (K, V, end): buffers its kept keys and values end at `end` in

    def advance(self, t):
        """The forward's t new tokens counted in; the next forward's calls counted afresh."""
        self.pos = self.pos + t
        self.calls, self.called, self.carried, self.contexts = 0, {}, 0, 0

    def new(self, x):
        """The tokens of x after the cached ones; if x does not start with them, start over."""
        held = 0 if self.tokens is None else self.tokens.shape[-1]
        if not 0 < held < x.shape[-1] or not torch.equal(x[..., :held], self.tokens):
            self.__init__(self.joins, self.length, self.device)
            held = 0
        self.tokens = x
        return x[..., held:]

    def extend(self, layer, K, V, keep=None):
        """The layer's cached keys and values followed by these, which it keeps (the last
        `keep` positions only, under a sliding window). A layer of None is the next attention
        call of this forward: calls are keyed by their order. A module called again by one
        forward (its output written twice, its weights shared by layers) is another attention
        each time: its calls are keyed by their order too."""
        if layer is None:
            layer, self.calls = self.calls, self.calls + 1
        else:
            n = self.called[layer] = self.called.get(layer, -1) + 1
            layer = (layer, n) if n else layer
        if self.length is not None:
            return self.written(layer, K, V)
        if layer in self.kv:
            K, V = self.appended(layer, K, V)
        drop = 0 if keep is None else K.shape[-2] - keep
        self.kv[layer] = (K[..., drop:, :], V[..., drop:, :]) if drop > 0 else (K, V)
        return K, V

    def written(self, layer, K, V):
        """A static cache's every position, K and V written at theirs. Those not yet written
        hold zeros, and lie after every query: the causal rule of each mask hides them (a
        sliding window's too, which a static cache masks rather than drops)."""
        t = K.shape[-2]
        if torch.is_grad_enabled() and K.requires_grad:  # its buffers are written over
            raise ValueError("a static cache (new_cache(length=…)) decodes without gradients: "
                             "new_cache() passes them on")
        if not torch.compiler.is_compiling() and int(self.pos) + t > self.length:
            raise ValueError(f"this static cache holds {self.length} positions: "
                             f"{int(self.pos) + t} do not fit (new_cache(length=…))")
        held = self.kv.get(layer)
        if held is None:
            held = self.kv[layer] = (K.new_zeros((*K.shape[:-2], self.length, K.shape[-1])),
                                     V.new_zeros((*V.shape[:-2], self.length, V.shape[-1])))
        elif held[0].shape[:-2] != K.shape[:-2]:  # their keys would be lost, or misread
            raise ValueError(f"this static cache holds keys for {tuple(held[0].shape[:-2])}, "
                             f"not {tuple(K.shape[:-2])}: decode another batch through a new "
                             "cache")
        at = self.pos + torch.arange(t, device=K.device)  # (t,)
        held[0].index_copy_(-2, at, K)
        held[1].index_copy_(-2, at, V)
        return held

    def appended(self, layer, K, V):
        """The layer's kept keys then K (values alike). Without gradients they are written
        after the kept ones in buffers with room to spare, which grow by a quarter when full
        (only then is the past copied): a decoded token costs no copy of every position
        before it, and the room costs a quarter more memory at most."""
        K_past, V_past = self.kv[layer]
        if torch.is_grad_enabled() and (K.requires_grad or K_past.requires_grad) or \
                torch.compiler.is_compiling():  # a buffer made in a graph is not one it keeps
            return torch.cat([K_past, K], dim=-2), torch.cat([V_past, V], dim=-2)
        n, t = K_past.shape[-2], K.shape[-2]
        K_room, V_room, end = self.room.get(layer, (None, None, 0))
        if K_room is None or end + t > K_room.shape[-2] or K_room.shape[:-2] != K.shape[:-2]:
            size = n + t + max((n + t) // 4, 16)
            K_room = K.new_empty((*K.shape[:-2], size, K.shape[-1]))
            V_room = V.new_empty((*V.shape[:-2], size, V.shape[-1]))
            K_room[..., :n, :], V_room[..., :n, :], end = K_past, V_past, n
        K_room[..., end:end + t, :], V_room[..., end:end + t, :] = K, V
        end += t
        self.room[layer] = K_room, V_room, end
        return K_room[..., end - n - t:end, :], V_room[..., end - n - t:end, :]

    def joined(self, weights):
        """project's matrices side by side, their biases (None if none has one) and widths;
        None where joining would copy more than JOINED_MAX weights.
        Made once per cache: over a generation the weights stay as they are."""
        key = tuple(id(W) for W, _ in weights)
        found = self.joins.get(key, False)
        if found is False:
            found = self.joins[key] = None if sum(W.numel() for W, _ in weights) > JOINED_MAX \
                else (torch.cat([W for W, _ in weights], 1),
                      None if all(b is None for _, b in weights) else
                      torch.cat([W.new_zeros(W.shape[1]) if b is None else b for W, b in weights]),
                      [W.shape[1] for W, _ in weights])
        return found

    def mask(self, Q, K):
        """Which keys each new query sees: the cached ones, and the new ones up to itself."""
        q, k = Q.shape[-2], K.shape[-2]
        if self.length is not None:  # the keys of every position, written or not
            return self.pos + torch.arange(q, device=Q.device)[:, None] >= \
                torch.arange(k, device=Q.device)
        if q == 1:
            return None  # the newest token sees every position
        return torch.ones(q, k, dtype=torch.bool, device=Q.device).tril(k - q)

    def sees_all(self, Q):
        """Whether the new queries see every key at hand: one decoded token, which a window's
        cache keeps only the visible keys for; never in a static cache."""
        return self.length is None and Q.shape[-2] == 1

    def positioned(self, over, t):
        """A value of every pair of positions (T5's buckets), made by over(past) for the t new
        positions after `past` ones, at the new rows. A static cache makes it over all of its
        positions (the keys it holds; those not yet written hidden by the causal masks) and
        reads the rows at its position."""
        if self.length is None:
            return over(self.pos)[..., self.pos:, :]
        every = over(self.length - t)  # (…, length, length)
        return every.index_select(-2, self.pos + torch.arange(t, device=every.device))

    def resume(self, h):
        """The state the last cached position left in the next recurrence of this forward
        (h, its start, before any), and the key `hold` keeps its new one under: recurrences
        are keyed by their order in the forward, as attention calls are by extend."""
        n, self.carried = self.carried, self.carried + 1
        return self.states.get(n, h), n

    def hold(self, key, h):
        """The state after the new positions, where the next tokens resume: a copy of its
        own, not a view that keeps the new positions' whole tensor (and, traced, every
        state of one layout: a decode step's graph serves the next)."""
        self.states[key] = h.contiguous()

    def holds(self, z):
        """Whether the source z is the one this cache encoded. A cache that holds tokens
        decoded after another source has nothing for z: it refuses it (start a new cache).
        A trace reads no data: there the source is the tensor the cache encoded, by identity,
        and the graph asserts that its values are still those encoded."""
        if torch.compiler.is_compiling():
            if self.source is not None and z is self.given:
                torch._assert_async((z == self.source).all(), "the source was written over "
                                    "after this cache encoded it: decode through a new cache")
                return True
        elif self.source is not None and self.source.shape == z.shape and \
                torch.equal(self.source, z):
            return True
        if self.kv or self.states:
            raise ValueError("this cache holds tokens decoded after another source: decode "
                             "this one through a new cache (new_cache())" +
                             (", or give a traced forward the source tensor it encoded"
                              if torch.compiler.is_compiling() else ""))
        return False

    def keep(self, z, *encoding):
        """Keep the source z (a copy: the caller may write into its own; and z itself, which
        a trace knows it by) and what the encoder made of it, for the tokens decoded after."""
        self.source, self.given, self.encoding, self.context = z.clone(), z, encoding, []

    def kept(self):
        """What the next step of this forward that reads the source alone (a cross-attention's
        keys and values) made of it before, or None where it has not yet: made once per
        source, in the order every forward makes them."""
        n, self.contexts = self.contexts, self.contexts + 1
        return self.context[n] if n < len(self.context) else None

    def keep_context(self, *values):
        """Keep what that step made of the source, for the tokens decoded after."""
        self.context.append(values)


def first_query(cache, Q, K):
    """The position of the first query Q among the keys K at hand: after the keys decoded
    before; a static cache's own position (its keys are every position it holds)."""
    return K.shape[-2] - Q.shape[-2] if cache is None or cache.length is None else cache.pos


def rows_at(W, start, count):
    """W's rows start, …, start + count − 1: of a table over positions, read at the new tokens'
    positions. A static cache's position is a tensor: a gather there, which a trace keeps."""
    if isinstance(start, torch.Tensor):
        return W[start + torch.arange(count, device=W.device)]
    return W[start:start + count]


def beyond(end, limit):
    """Whether positions up to `end` pass `limit`. A static cache's (a tensor) never do: its
    length was held to the limit when it was made."""
    return not isinstance(end, torch.Tensor) and end > limit


# Joining copies the weights; it pays where a product's dispatch, not its arithmetic, is its
# cost: a decoded row against at most 2^20 weights (4 MiB in float32).
JOINED_MAX = 1 << 20


def project(X, *weights, cache=None):
    """X W + b for each (W, b) of weights (b None: no bias). While decoding (a cache, and no
    gradients) one product by the matrices side by side, split; else one product each."""
    joined = None if cache is None or torch.is_grad_enabled() else cache.joined(weights)
    if joined is None:
        return [X @ W if b is None else F.linear(X, W.T, b) for W, b in weights]
    W, b, widths = joined
    return (X @ W if b is None else X @ W + b).split_with_sizes(widths, -1)


def inference_made():
    """Whether tensors made now are inference tensors (under torch.inference_mode), which a
    training step's autograd cannot save: memos keep them apart. While torch.compile traces,
    no: it cannot trace the question (a compiled forward under inference mode shares its
    memos with the uncompiled ones)."""
    return not torch.compiler.is_compiling() and torch.is_inference_mode_enabled()


ANGLES = {}  # (convention, positions, widths, base, device, type, inference) → RoPE's cos and sin
TABLES = {}  # (convention, widths, base, device, type, inference) → the same for positions 0, 1, …


def real_type(dtype):
    """The number format of reals computed from integers alone (RoPE's angles, a position
    divided) beside values of `dtype`: float64 for float64, else float32 (in bfloat16 or
    float16 a position's angle would lose its digits)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def rope_angles(pairs, X, theta_base, past, width=None):
    """RoPE's tables at X's rows, those of the angles (past + t) ω_i, ω_i = θ_base^{−2i/r}
    (or a card's frequencies: rope_frequencies): cos (T, d),
    its columns after the first r = width (all d by default) 1; sin (T, r), each plane's
    first sine negated, the planes those of the convention; the same sine (T, d), 0 after
    column r; and each column's partner in its plane (d,). Sliced from a table over every
    position so far: a decoded token costs no trigonometry. Tables made under inference mode
    are kept apart: autograd cannot save them for a training step's backward."""
    T, d = X.shape[-2], X.shape[-1]
    dtype = real_type(X.dtype)
    if isinstance(past, torch.Tensor):  # a static cache's position: the angles there alone
        at = (past + torch.arange(T, device=X.device)).to(dtype)
        return rope_rows(pairs, d, d if width is None else width, theta_base, at)
    if torch.compiler.is_compiling():  # the memo's size would be a guard: a graph per token
        table = rope_table(pairs, d, d if width is None else width, theta_base, X.device,
                           past + T, dtype)
        return *(rows[past:past + T] for rows in table[:3]), table[3]
    key = pairs, past, T, d, width, theta_base, X.device, dtype, inference_made()
    found = ANGLES.get(key)
    if found is None:
        if len(ANGLES) > 64:
            ANGLES.clear()
        r = d if width is None else width
        table = rope_table(pairs, d, r, theta_base, X.device, past + T, dtype)
        found = ANGLES[key] = *(rows[past:past + T] for rows in table[:3]), table[3]
    return found


def rope_table(pairs, d, r, theta_base, device, positions, dtype=torch.float32):
    """rope_angles' tables, for at least `positions` positions (grown by doubling), computed
    in `dtype` from the frequencies on."""
    key = pairs, d, r, theta_base if isinstance(theta_base, tuple) else float(theta_base), \
        device, dtype, inference_made()
    table = TABLES.get(key)
    if table is None or table[0].shape[0] < positions:
        n = max(positions, 64 if table is None else 2 * table[0].shape[0])
        table = TABLES[key] = rope_rows(pairs, d, r, theta_base,
                                        torch.arange(n, device=device, dtype=dtype))
    return table


def rope_rows(pairs, d, r, theta_base, at):
    """rope_angles' tables at the positions `at` (n,), in their number format."""
    omega = rope_frequencies(theta_base, r, at.device, at.dtype)
    phi = at[:, None] * omega
    cos, sin = phi.cos(), phi.sin()  # (n, r/2)
    n = at.shape[0]
    columns = torch.arange(d, device=at.device)
    partners = columns[:r].view(-1, 2).flip(-1).flatten() if pairs else columns[:r].roll(r // 2)
    if pairs:
        cos, sin = cos.repeat_interleave(2, -1), torch.stack([-sin, sin], -1).flatten(-2)
    else:
        cos, sin = cos.repeat(1, 2), torch.cat([-sin, sin], dim=-1)
    return (torch.cat([cos, cos.new_ones(n, d - r)], -1), sin,
            torch.cat([sin, sin.new_zeros(n, d - r)], -1), torch.cat([partners, columns[r:]]))


def rope_frequencies(theta_base, r, device, dtype):
    """RoPE's r/2 frequencies: θ_base^{−2i/r} for a base, or a card's own for
    (function, its hyperparameters…): function(r, …, device, dtype), the card's steps that
    compute them (a base written as a number, a rescaling)."""
    if isinstance(theta_base, tuple):
        function, *hypers = theta_base
        return function(r, *hypers, device, dtype).to(device, dtype)
    return theta_base ** -(torch.arange(0, r, 2, device=device, dtype=dtype) / r)


def turn(X, cos, sin, wide_sin, partners, pairs):
    """X cos plus, in the first r columns (as many as sin has), each column's partner in its
    plane times its sine: the halves of those columns swapped, or each pair (`pairs`). With
    no backward to come (decoding) the partners are gathered, one dispatch; else they are
    rolled into place, a copy whose backward is a roll too, where a gather's is a scatter."""
    if not X.requires_grad:
        return (X * cos).addcmul_(X[..., partners], wide_sin)
    r = sin.shape[-1]
    part = X if r == X.shape[-1] else X[..., :r]
    partner = part.unflatten(-1, (-1, 2)).roll(1, -1).flatten(-2) if pairs else \
        part.roll(r // 2, -1)
    Y = X * cos
    (Y if part is X else Y[..., :r]).addcmul_(partner, sin)
    return Y


def rotate_half(X, theta_base, past=0, width=None):
    """RoPE in the rotate-half convention on the first `width` columns of X (all by default),
    row t at position past + t (from 0), turned in the planes (X[t, i], X[t, r/2 + i]); the
    rest pass through."""
    return turn(X, *rope_angles(False, X, theta_base, past, width), pairs=False)


def rotate_pairs(X, theta_base, past=0, width=None):
    """RoPE on interleaved pairs of the first `width` columns of X (all by default), row t at
    position past + t (from 0), turned in the planes (X[t, 2i], X[t, 2i + 1]); the rest pass
    through."""
    return turn(X, *rope_angles(True, X, theta_base, past, width), pairs=True)


RMS_EPS = {}  # (ε, D) → √ε and 1/√D as CPU tensors: a Python number costs a tensor each use


def rms_normalize(X, shape, gamma, eps):
    """X/√(mean(X²) + ε) ⊙ γ over the last axis (γ None: no gains). F.rms_norm where gradients
    flow, off the CPU, or in another type than float32 (F.rms_norm computes in float32); on the
    CPU without gradients, where a decoded token makes each call a few numbers, as
    X/hypot(‖X‖/√D, √ε): five dispatches where F.rms_norm's composite makes nine, the same
    number to rounding."""
    if torch.is_grad_enabled() or X.device.type != "cpu" or X.dtype != torch.float32:
        return F.rms_norm(X, shape, gamma, eps)
    key = eps, shape[-1]
    roots = RMS_EPS.get(key)
    if roots is None:
        roots = RMS_EPS[key] = torch.tensor(math.sqrt(eps)), torch.tensor(shape[-1] ** -0.5)
    norm = torch.linalg.vector_norm(X, dim=-1, keepdim=True)
    normed = X / torch.hypot(norm * roots[1], roots[0])
    return normed if gamma is None else normed * gamma


def offset_rms_norm(X, shape, gamma, eps):
    """RMSNorm whose gains are stored less one: X̂ + X̂ γ, X̂ normalised with no gains, for
    X̂ (1 + γ) without forming 1 + γ (one step fewer, and γ's low digits kept)."""
    normed = rms_normalize(X, shape, None, eps)
    return torch.addcmul(normed, normed, gamma)



def patch_grid(X, p):
    """The blocks of p×p pixels an image X (…, C, H, W) cuts into, down and across; an image
    that p does not divide is refused, naming both."""
    H, W = X.shape[-2:]
    if H % p or W % p:
        raise ValueError(f"an image of {H}×{W} pixels does not cut into {p}×{p} patches")
    return H // p, W // p


def cut_patches(X, p):
    """patches(X | p) of an image X (…, C, H, W): one row per p×p block, blocks down then
    across, each the block's entries channel by channel, then row by row, (…, N, C·p·p). A
    view of X split and permuted, then one copy: what a matrix product with the patch
    embedding needs (measured against a convolution in bench/patches.py)."""
    rows, cols = patch_grid(X, p)
    *lead, C, _, _ = X.shape
    blocks = X.reshape(*lead, C, rows, p, cols, p)
    n = len(lead)
    order = (*range(n), n + 1, n + 3, n, n + 2, n + 4)
    return blocks.permute(order).reshape(*lead, rows * cols, C * p * p)


def gather_patches(X, p):
    """patches(X | p) entry by entry, as the card's notation defines it: row (i − 1)·W/p + j,
    column (c − 1)·p² + (a − 1)·p + b holds X[c, (i − 1)·p + a, (j − 1)·p + b] (counted from
    0 here), gathered through one index of every entry."""
    rows, cols = patch_grid(X, p)
    C, H, W = X.shape[-3:]
    block = torch.arange(rows * cols, device=X.device)
    entry = torch.arange(C * p * p, device=X.device)
    i, j = block // cols, block % cols
    c, a, b = entry // (p * p), entry // p % p, entry % p
    index = (c * H + (i * p)[:, None] + a) * W + (j * p)[:, None] + b
    return X.flatten(-3)[..., index]


def broadcast_sizes(*shapes):
    """The shape tensors of these shapes broadcast to, as torch.broadcast_shapes gives it,
    without its symbolic-shape machinery: that took 20 to 170 µs a call, more than a decoded
    token's bias lookup it served."""
    rank = max(len(shape) for shape in shapes)
    out = [1] * rank
    for shape in shapes:
        for i, n in enumerate(shape, rank - len(shape)):
            if n != 1 and out[i] != n:
                if out[i] != 1:
                    raise RuntimeError("shapes that do not broadcast: " + str(shapes))
                out[i] = n
    return tuple(out)


def cat_broadcast(tensors, dim):
    """torch.cat along `dim` (negative) of tensors whose other axes broadcast: a value every
    head shares, (…, 1, T, k), beside one per head, (…, H, T, w), as a head's own columns
    beside a key shared by every head join."""
    sizes = [list(t.shape) for t in tensors]
    for size in sizes:
        size[dim] = 1
    shape = list(broadcast_sizes(*sizes))
    out = []
    for t in tensors:
        shape[dim] = t.shape[dim]
        out.append(t.expand(shape))
    return torch.cat(out, dim=dim)

def lookup(table, index, rank, first=0):
    """table[…, index − first]: entries of a vector looked up by a tensor of indices (counted
    from `first`) with `rank` card axes, the axes in front of both (examples, heads) broadcast
    against each other, as a bias table per head is read at the bucket of each pair of
    positions. Indices broadcast along an axis (every example's buckets, one table) are read
    once along it and the result broadcast back: what is made of them, and their gradient,
    once too."""
    n, lead = table.shape[-1], table.shape[:-1]
    shape = broadcast_sizes(lead + (1,) * rank, index.shape)
    index = index[tuple(slice(0, 1) if step == 0 else slice(None) for step in index.stride())]
    if first:
        index = index - first
    front = index.shape[:index.dim() - rank]  # the index's axes in front of its card axes
    rest = front[:max(0, len(front) - len(lead))]  # those before the table's own
    if all(k == 1 for k in front[len(rest):]):
        # every entry of the table's front axes reads the same indices: one selection of the
        # table's rows, whose backward adds into the table (index_add, 4× F.embedding's on
        # the CPU); a gather from the table broadcast to the indices' shape would make its
        # gradient, entries × n, at that size first
        at = index.reshape(rest + index.shape[index.dim() - rank:])
        rows = table.reshape(-1, n).T.index_select(0, at.flatten())  # (…, entries of the table)
        rows = rows.reshape(at.shape + lead)
        rows = rows.movedim(tuple(range(-len(lead), 0)), tuple(range(-len(lead) - rank, -rank)))
    else:
        table = table.reshape(lead + (1,) * rank + (n,))
        wide = broadcast_sizes(table.shape[:-1], index.shape)
        rows = table.expand(wide + (n,)).gather(-1, index.expand(wide).unsqueeze(-1)).squeeze(-1)
    return rows.expand(shape)


def shared_mask(site, make, queries, keys, device, *numbers, dtype=None):
    """A mask site's visible positions, (queries, keys): a value made once (shared_value, the
    site counted negative, apart from the values'), shared by every layer and every decoding
    step of the same sizes, device and numbers; None where every position is visible (a
    decoded token that sees all the keys a window keeps). With a dtype, as a bias to add to
    scores: 0 where visible, −∞ where hidden."""
    def as_bias(mask):
        return mask if dtype is None else \
            torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill(~mask, float("-inf"))

    def made():
        mask = make()
        return None if mask.all().item() else as_bias(mask)

    if torch.compiler.is_compiling():  # in a graph: the mask itself, nothing read back
        return as_bias(make())
    return shared_value(-site, made, queries, keys, device, dtype, *numbers)


VALUES = {}  # (value site's number, what it reads, tensors by identity) → (the value, those tensors)


def shared_value(site, make, *reads):
    """A value of the sizes, hyperparameters, devices and number formats it reads alone (ALiBi's
    slopes, a bias of the positions), made once per those and shared by every layer and every
    forward that reads the same. A tensor it reads is such a value too, keyed by identity: the
    entry holds it, so no other tensor takes its id while the entry stands. One made under
    inference mode is kept apart: autograd cannot save it."""
    if torch.compiler.is_compiling():  # the memo's size would be a guard: a graph per token
        return make()
    key = site, inference_made(), \
        *(id(r) if isinstance(r, torch.Tensor) else r for r in reads)
    found = VALUES.get(key)
    if found is None:
        if len(VALUES) > 256:
            VALUES.clear()
        found = VALUES[key] = make(), [r for r in reads if isinstance(r, torch.Tensor)]
    return found[0]


def grouped_sdpa(Q, K, V, **options):
    """F.scaled_dot_product_attention over heads on any leading axes. Keys and values shared
    by groups of query heads come in fewer heads, (…, H_kv, T, d) against (…, H, T, d) with
    each group's heads side by side, or with a size-1 axis where the queries hold a group
    ((…, 1, T, d) against (…, G, T, d)): SDPA's grouped-query path serves them, uncopied."""
    if K.dim() < 3 or K.shape[-3] == Q.shape[-3]:
        return F.scaled_dot_product_attention(Q, K, V, **options)
    if K.shape[-3] != 1 or Q.dim() == 4:
        return F.scaled_dot_product_attention(Q, K, V, enable_gqa=True, **options)
    groups = Q.shape[-4:-2]  # (key/value heads, query heads of each)
    mask = options.get("attn_mask")
    if mask is not None and mask.dim() == Q.dim():  # a mask for every query head: theirs too
        options = {**options, "attn_mask": mask.flatten(-4, -3)}
    Y = F.scaled_dot_product_attention(Q.flatten(-4, -3), K.squeeze(-3), V.squeeze(-3),
                                       enable_gqa=True, **options)
    return Y.unflatten(-3, groups)


def factored_sdpa(A, B, R, K, V, out=None, cols=None, **options):
    """grouped_sdpa(cat_broadcast([A @ B.mT, R], -1), K, V, **options)[…, :cols] @ out (R,
    cols, out: None where absent), the products associated as costs least at these sizes.
    The queries' part A Bᵀ meets the keys' first columns K₁ (as wide as B has rows):
    (A Bᵀ) K₁ᵀ = A (K₁ B)ᵀ, and the attended values' product by `out` is that of the values:
    (softmax(S) V) U = softmax(S) (V U). Moved onto the keys and values, B and U cost a
    product per key, and the scores and the attended values are as narrow as A and U;
    left on the queries, a product per query, and they are as wide as B's rows and V. A
    decoded token, one query against many cached keys, keeps them on the queries (the cache
    holds K alone); a whole sequence moves them onto the keys."""
    n, a = B.shape[-2], B.shape[-1]
    r = 0 if R is None else R.shape[-1]
    tq, tk = A.shape[-2], K.shape[-2]
    c = V.shape[-1] if cols is None else cols
    u = c if out is None else out.shape[-1]
    queries = tq * n * a + tq * tk * (n + r + V.shape[-1]) + (0 if out is None else tq * c * u)
    keys = tk * n * a + tq * tk * (a + r + max(u, a + r)) + (0 if out is None else tk * c * u)
    if queries <= keys or out is not None and out.dim() < 2:  # a vector: (…, T) outputs
        Q = A @ B.mT if R is None else cat_broadcast([A @ B.mT, R], -1)
        Y = grouped_sdpa(Q, K, V, **options)
        Y = Y if cols is None else Y[..., :cols]
        return Y if out is None else Y @ out
    options.setdefault("scale", 1.0 / math.sqrt(n + r))  # the scores' own width
    Q = A if R is None else cat_broadcast([A, R], -1)
    lead = K[..., :n]
    if V is K and cols == n and out is not None and B.shape[:-1] == out.shape[:-1] \
            and u <= a + r:
        # the values are the keys' lead too: one product for both, (…, T, a + u), split (not
        # sliced twice: a slice's gradient is a zeroed copy of the whole product); the values
        # padded with zeros to the keys' width, their attended padding dropped
        keys, values = heads_product(lead, torch.cat([B, out], -1)).split([a, u], -1)
        K = keys if R is None else cat_broadcast([keys, K[..., n:]], -1)
        pad = values.new_zeros(values.shape[:-1] + (a + r - u,))
        return grouped_sdpa(Q, K, torch.cat([values, pad], -1), **options).split(
            [u, a + r - u], -1)[0]
    K = heads_product(lead, B) if R is None else cat_broadcast([heads_product(lead, B),
                                                                K[..., n:]], -1)
    V = V if cols is None else V[..., :cols]
    V = V if out is None else heads_product(V, out)
    w = K.shape[-1]
    if V.shape[-1] < w:  # SDPA's fused kernels take values as wide as the keys only
        V = torch.cat([V, V.new_zeros(V.shape[:-1] + (w - V.shape[-1],))], -1)
    return grouped_sdpa(Q, K, V, **options)[..., :u]


def heads_product(X, W):
    """X @ W of rows every head shares, (…, 1, T, n), by each head's matrix, (H, n, w): one
    product by the heads' matrices side by side, (…, H, T, w), where broadcasting X over the
    heads would make a product per head and example."""
    if X.dim() < 3 or X.shape[-3] != 1 or W.dim() != 3:
        return X @ W
    H, n, w = W.shape
    Y = X.squeeze(-3) @ W.transpose(0, 1).reshape(n, H * w)  # (…, T, H w)
    return Y.unflatten(-1, (H, w)).transpose(-3, -2)


def linear_scan(a, b, h, dim):
    """Every state of h_t = a_t ⊙ h_{t−1} + b_t along the positions axis `dim` (negative),
    from h (h_0, without that axis): h_1, …, h_T at once. ⌈log₂ T⌉ rounds of whole-tensor
    products and sums (the prefix scan of the pairs (a_t, b_t), composed as
    (a, b) then (a′, b′) = (a′ a, a′ b + b′)): no logarithm and no division, so a gate may be
    0 or negative and nothing overflows; each state is rounded at most ⌈log₂ T⌉ times more
    than the loop rounds it."""
    like = b if torch.is_tensor(b) else a  # a gate or an input may be a number
    a, b = (torch.as_tensor(x, dtype=like.dtype, device=like.device) for x in (a, b))
    a, b = torch.broadcast_tensors(a, b)
    if torch.is_tensor(h) and h.dim() > 0:
        h = h.unsqueeze(dim)
    n = b.shape[dim]
    b = torch.cat([a.narrow(dim, 0, 1) * h + b.narrow(dim, 0, 1), b.narrow(dim, 1, n - 1)], dim)
    step = 1
    while step < n:  # position i holds the composition of positions i − 2·step + 1, …, i
        a_late, rest = a.narrow(dim, step, n - step), n - step
        b = torch.cat([b.narrow(dim, 0, step), a_late * b.narrow(dim, 0, rest) +
                       b.narrow(dim, step, rest)], dim)
        if 2 * step < n:
            a = torch.cat([a.narrow(dim, 0, step), a_late * a.narrow(dim, 0, rest)], dim)
        step *= 2
    return b


def previous_states(states, h, dim):
    """Each position's state before its update: h (h_0, without the positions axis `dim`),
    then the states of linear_scan but the last."""
    first = torch.zeros_like(states.narrow(dim, 0, 1))
    first = first + (h.unsqueeze(dim) if torch.is_tensor(h) and h.dim() > 0 else h)
    return torch.cat([first, states.narrow(dim, 0, states.shape[dim] - 1)], dim)


def stack_broadcast(rows, dim):
    """Rows a loop over positions collected, stacked on a new axis `dim`: the first may lack
    batch axes that later ones carry (a state that starts as a parameter)."""
    return torch.stack(torch.broadcast_tensors(*rows), dim)


LOGITS_AT_ONCE = 1 << 24  # the logits log_likelihood holds at once: 64 MiB in float32


def log_likelihood(head, h, rows, targets, width):
    """Σ over the rows picked of log softmax(head(h[…, rows, :]))[targets], per example (…,),
    the head's logits (width of them per row) made a few rows at a time: no more than
    LOGITS_AT_ONCE at once, each chunk's made again for the backward pass (a checkpoint) where
    there are several, so the loss never holds every position's logits."""
    h = h[..., rows, :]  # (…, R, D): the rows scored
    per_row = max(1, h[..., 0, 0].numel() * width)  # logits in one row of every example
    size = max(1, LOGITS_AT_ONCE // per_row)

    def chunk(h, targets):  # (…, c, D), (…, c) → (…,)
        logp = torch.log_softmax(head(h), dim=-1)  # (…, c, width)
        return logp.gather(-1, targets[..., None])[..., 0].sum(-1)

    if h.shape[-2] <= size:
        return chunk(h, targets)
    total = 0
    for lo in range(0, h.shape[-2], size):
        part = h[..., lo:lo + size, :], targets[..., lo:lo + size]
        total = total + torch.utils.checkpoint.checkpoint(chunk, *part, use_reentrant=False)
    return total
