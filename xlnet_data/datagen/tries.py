"""The compiled tries of our unigram encoder (datagen/unigram.py): a double array we build for the pieces,
and a reader of the Darts double array that SentencePiece stores its normalisation table in.

Our double array has one int64 slot a node, three 21-bit fields: the parent's slot ("check"), the base that
the node's children's slots are offset from, and the value + 1 of the key that ends there (0: none). A byte b
leads from node s to slot base(s) + b when that slot's check is s, so one load a byte walks the trie and finds
the pieces that end there (the 78,344 slots of XLNet's 32,000 pieces take 0.6 MB). Built in compiled code
from the sorted keys, first fit over a list of the free slots.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from xlnet_data.common import compiled
from xlnet_data.dataformat.spm_model import darts_offset

BITS = 21
MASK = (1 << BITS) - 1
NO_PARENT = MASK  # the check of the root and of a free slot
MAX_SLOTS = MASK  # slots are numbered below NO_PARENT; values below 2**21 - 1


class TrieTooLarge(ValueError):
    """The keys need more slots than 21 bits can number, or a value is 2**21 - 1 or more."""


@compiled.jit(inline="always")
def slot_check(slot):
    return slot & MASK


@compiled.jit(inline="always")
def slot_base(slot):
    return (slot >> BITS) & MASK


@compiled.jit(inline="always")
def slot_value(slot):
    """The value of the key that ends at this slot's node, or -1."""
    return (slot >> (2 * BITS)) - 1


@compiled.jit()
def _child_labels(keys, starts, lo, hi, depth, labels, group_ends):
    """The bytes that follow the first `depth` (shared) bytes of the sorted keys[lo:hi], all longer than
    `depth`, and where each byte's keys end. Returns their number."""
    count = 0
    for k in range(lo, hi):
        label = np.int64(keys[starts[k] + depth])
        if count == 0 or labels[count - 1] != label:
            labels[count] = label
            count += 1
        group_ends[count - 1] = k + 1
    return count


@compiled.jit()
def _fits(check, base, labels, count):
    for i in range(count):
        if check[base + labels[i]] != NO_PARENT:
            return False
    return True


@compiled.jit()
def grown(array, size, fill):
    """`array`, or a copy at least `size` long (twice as long at least) with `fill` after its items."""
    if size <= array.shape[0]:
        return array
    bigger = np.full(max(size, 2 * array.shape[0]), fill, dtype=array.dtype)
    bigger[:array.shape[0]] = array
    return bigger


@compiled.jit()
def _build(keys, starts, values):
    """Slots of the double array of the sorted, distinct byte strings keys[starts[k]:starts[k + 1]] with
    values[k] (see the module's docstring); an empty array when they do not fit in 21 bits.

    A node's children go to the first base that fits, tried at the free slots below `high` (the end of the
    slots taken so far; all slots from it on are free), which a doubly linked list keeps in ascending order:
    trying every base from the first free slot on took 12 s for XLNet's 32,000 pieces."""
    check = np.full(1024 + 2 * keys.shape[0], NO_PARENT, dtype=np.int64)
    base = np.zeros(check.shape[0], dtype=np.int64)
    value = np.zeros(check.shape[0], dtype=np.int64)  # + 1: 0 for none
    next_free = np.full(check.shape[0], -1, dtype=np.int64)
    prev_free = np.full(check.shape[0], -1, dtype=np.int64)
    head, tail, high = -1, -1, 1  # the free list below `high`; slot 0 is the root's
    labels = np.empty(256, dtype=np.int64)
    group_ends = np.empty(256, dtype=np.int64)
    stack = [(0, 0, starts.shape[0] - 1, 0)]  # (node's slot, its keys lo:hi, depth)
    while stack:
        node, lo, hi, depth = stack.pop()
        if lo < hi and starts[lo + 1] - starts[lo] == depth:  # sorted: the key that ends here comes first
            value[node] = values[lo] + 1
            lo += 1
        if lo == hi:
            continue
        count = _child_labels(keys, starts, lo, hi, depth, labels, group_ends)
        at = -1
        free = head
        while free >= 0:
            if free - labels[0] >= 1 and _fits(check, free - labels[0], labels, count):
                at = free - labels[0]
                break
            free = next_free[free]
        if at < 0:  # no base below `high` fits: the first one past it
            at = max(high - labels[0], 1)
            while not _fits(check, at, labels, count):
                at += 1
        size = at + labels[count - 1] + 257  # room for _fits at `high` + 255 later
        check = grown(check, size, NO_PARENT)
        base, value = grown(base, check.shape[0], 0), grown(value, check.shape[0], 0)
        next_free, prev_free = grown(next_free, check.shape[0], -1), grown(prev_free, check.shape[0], -1)
        base[node] = at
        for i in range(count):
            slot = at + labels[i]
            if slot < high:  # take it off the free list
                before, after = prev_free[slot], next_free[slot]
                if before >= 0:
                    next_free[before] = after
                else:
                    head = after
                if after >= 0:
                    prev_free[after] = before
                else:
                    tail = before
            else:  # the slots skipped on the way go on the list's end
                for gap in range(high, slot):
                    prev_free[gap], next_free[gap] = tail, -1
                    if tail >= 0:
                        next_free[tail] = gap
                    else:
                        head = gap
                    tail = gap
                high = slot + 1
            check[slot] = node
            stack.append((slot, lo if i == 0 else group_ends[i - 1], group_ends[i], depth + 1))
    size = high
    if size >= MAX_SLOTS or values.max() + 1 >= MASK:
        return np.zeros(0, dtype=np.int64)
    slots = np.full(size + 256, NO_PARENT, dtype=np.int64)  # room for any byte's step from the last node
    for s in range(size):
        slots[s] = check[s] | (base[s] << BITS) | (value[s] << (2 * BITS))
    return slots


def build_double_array(keys: list, values) -> np.ndarray:
    """The slots of a double array of the distinct, non-empty byte strings `keys` and their int `values`
    (TrieTooLarge when they do not fit)."""
    order = sorted(range(len(keys)), key=keys.__getitem__)
    data = np.frombuffer(b"".join(keys[i] for i in order), dtype=np.uint8)
    starts = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(keys[i]) for i in order], out=starts[1:])
    slots = _build(data, starts, np.asarray(values, dtype=np.int64)[order])
    if not slots.size:
        raise TrieTooLarge(f"{len(keys)} keys do not fit in a trie of 2**{BITS} slots")
    return slots


@intrinsic
def prefetch(typingctx, array, i):
    """Compiled code's hint that array[i] will be read soon (LLVM's prefetch: no fault, no wait, a no-op where the
    CPU has none): a walk's next load issued while the loads before it are in flight."""
    def codegen(context, builder, signature, args):
        address = compiled.element_pointer(context, builder, signature.args[0], args[0], args[1], ir.IntType(8))
        i32 = ir.IntType(32)
        function_type = ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32])
        hint = builder.module.declare_intrinsic("llvm.prefetch.p0i8", fnty=function_type)
        builder.call(hint, [address, i32(0), i32(3), i32(1)])  # a read, kept in every cache level, of data
        return context.get_dummy_value()
    return types.void(array, types.intp), codegen


@compiled.jit()
def three_byte_nodes(slots):
    """For each code point (int64[65536]), the node of the double array `slots` that its three UTF-8 bytes lead to
    from the root, as its slot with the node's own index in place of its parent's (slot_check), so that a walk
    takes such a character in one load (each byte's was a dependent load of a slot): -1 where the bytes lead
    nowhere (no key begins with the character); -2 below U+0800 (two bytes or fewer), which a walk takes a byte at
    a time. For keys of UTF-8 text: a key that ends inside a character's bytes is not looked for."""
    nodes = np.full(1 << 16, -2, dtype=np.int64)
    root_base = slot_base(slots[0])
    for code in range(0x800, 1 << 16):
        key = (0xE0 | (code >> 12), 0x80 | ((code >> 6) & 0x3F), 0x80 | (code & 0x3F))
        node, base = 0, root_base
        for k in range(3):
            child = base + key[k]
            slot = slots[child]
            if slot_check(slot) != node:
                node = -1
                break
            node, base = child, slot_base(slot)
        nodes[code] = node if node < 0 else slots[node] & ~MASK | node
    return nodes


@compiled.jit(inline="always")
def longest_key(slots, data, pos, end):
    """(length, value) of the longest key of the double array `slots` that data[pos:end] starts with;
    (0, -1) for none."""
    node = 0
    base = slot_base(slots[0])
    best_length, best_value = 0, -1
    for i in range(pos, end):
        child = base + np.int64(data[i])
        slot = slots[child]
        if slot_check(slot) != node:
            break
        node, base = child, slot_base(slot)
        if slot_value(slot) >= 0:
            best_length, best_value = i - pos + 1, slot_value(slot)
    return best_length, best_value


# Darts-clone's unit: has_leaf bit 8, value the low 31 bits, label the low byte and bit 31, offset bits 10+
# shifted by 8 where bit 9 is set (spm_model.darts_offset). spm_model.charsmap_problem has checked that no walk
# leaves the array.
@compiled.jit(inline="always")
def darts_root(units):
    """The node a walk of SentencePiece's Darts double array `units` (uint32) starts from."""
    return darts_offset(np.int64(units[0]))


@compiled.jit(inline="always")
def darts_walk(units, node, data, pos, i, end, best_length, best_value):
    """The walk of darts_longest over data[pos:end], taken on at byte i from `node` with the longest key found
    before i: (length, value, walked, the node reached: where the walk goes on from when walked == end - pos)."""
    for j in range(i, end):
        c = np.int64(data[j])
        node ^= c
        unit = np.int64(units[node])
        if (unit & 0x800000FF) != c:
            return best_length, best_value, j - pos, node
        node ^= darts_offset(unit)
        if (unit >> 8) & 1:
            best_length, best_value = j - pos + 1, np.int64(units[node]) & 0x7FFFFFFF
    return best_length, best_value, end - pos, node


@compiled.jit(inline="always")
def darts_longest(units, data, pos, end):
    """(length, value, walked) of the longest key of SentencePiece's Darts double array `units` (uint32) that
    data[pos:end] starts with, as its commonPrefixSearch finds them ((0, 0) for none), and how many bytes of
    data[pos:end] lead somewhere in it."""
    length, value, walked, _ = darts_walk(units, darts_root(units), data, pos, pos, end, 0, 0)
    return length, value, walked
