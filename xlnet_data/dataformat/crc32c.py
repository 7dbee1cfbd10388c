"""CRC-32C as TFRecord framing uses it (masked), compiled: SSE 4.2's crc32 instruction where the CPU has it,
else slicing-by-8 tables. The writer (records.py) and the reader (record_reader.py) both check with it."""

import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from xlnet_data.common import compiled


def _crc32c_tables():
    """Slicing-by-8 tables of CRC-32C (Castagnoli, reflected): tables[k][b] is the CRC of byte b followed
    by k zero bytes, so that eight bytes are folded in with eight independent lookups."""
    tables = np.zeros((8, 256), dtype=np.uint32)
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        tables[0, i] = crc
    for k in range(1, 8):
        tables[k] = tables[0][tables[k - 1] & 0xFF] ^ (tables[k - 1] >> 8)
    return tables


CRC32C_TABLES = _crc32c_tables()


def _host_has_crc32_instruction():
    """Whether this CPU has SSE 4.2's crc32 instruction (CRC-32C in hardware), as LLVM sees it."""
    try:
        from llvmlite import binding
        return (binding.get_process_triple().startswith("x86_64")
                and "+sse4.2" in binding.get_host_cpu_features().flatten().split(","))
    except Exception:  # another architecture or llvmlite version: the table-driven CRC is always right
        return False


HARDWARE_CRC32C = _host_has_crc32_instruction()


def _crc32_instruction(state_bits, data_bits):
    """SSE 4.2's `crc32` on a `data_bits` operand (8 or 64), folding it into the CRC-32C state, as a function
    that compiled code calls (LLVM emits the one instruction: no call overhead)."""
    state_type, data_type = getattr(types, f"uint{state_bits}"), getattr(types, f"uint{data_bits}")
    name = f"llvm.x86.sse42.crc32.{state_bits}.{data_bits}"

    @intrinsic
    def crc32(typingctx, crc, data):
        def codegen(context, builder, signature, args):
            function_type = ir.FunctionType(ir.IntType(state_bits), [ir.IntType(state_bits), ir.IntType(data_bits)])
            return builder.call(builder.module.declare_intrinsic(name, fnty=function_type), args)
        return state_type(state_type, data_type), codegen

    return crc32


_crc32_u64 = _crc32_instruction(64, 64)  # eight bytes, a little-endian word
_crc32_u8 = _crc32_instruction(32, 8)


@intrinsic
def _load_u64_unaligned(typingctx, buf, i):
    """The eight bytes at buf[i:] (a uint8 array; need not be aligned) as one native uint64 load, little-endian
    on x86-64 (assembling them from eight byte loads and shifts took 3x the time of the crc32 instructions)."""
    def codegen(context, builder, signature, args):
        address = compiled.element_pointer(context, builder, signature.args[0], args[0], args[1], ir.IntType(64))
        return builder.load(address, align=1)
    return types.uint64(buf, types.intp), codegen


@compiled.jit(inline="always")
def crc32c_hardware(buf, begin, end):
    """CRC-32C of buf[begin:end] with the crc32 instruction, eight bytes at a time (x86-64 with SSE 4.2)."""
    crc = np.uint64(0xFFFFFFFF)
    i = begin
    while i + 8 <= end:
        crc = _crc32_u64(crc, _load_u64_unaligned(buf, i))
        i += 8
    small = np.uint32(crc)
    while i < end:
        small = _crc32_u8(small, buf[i])
        i += 1
    return small ^ np.uint32(0xFFFFFFFF)


@compiled.jit(inline="always")
def crc32c_sliced(buf, begin, end):
    """CRC-32C of buf[begin:end] by slicing-by-8 (any CPU): eight table lookups per eight bytes."""
    t = CRC32C_TABLES
    crc = np.uint32(0xFFFFFFFF)
    i = begin
    while i + 8 <= end:
        low = crc ^ (np.uint32(buf[i]) | (np.uint32(buf[i + 1]) << np.uint32(8))
                     | (np.uint32(buf[i + 2]) << np.uint32(16)) | (np.uint32(buf[i + 3]) << np.uint32(24)))
        crc = (t[7, low & np.uint32(0xFF)] ^ t[6, (low >> np.uint32(8)) & np.uint32(0xFF)]
               ^ t[5, (low >> np.uint32(16)) & np.uint32(0xFF)] ^ t[4, low >> np.uint32(24)]
               ^ t[3, buf[i + 4]] ^ t[2, buf[i + 5]] ^ t[1, buf[i + 6]] ^ t[0, buf[i + 7]])
        i += 8
    while i < end:
        crc = t[0, (crc ^ buf[i]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        i += 1
    return crc ^ np.uint32(0xFFFFFFFF)


_crc32c = crc32c_hardware if HARDWARE_CRC32C else crc32c_sliced


@compiled.jit(inline="always")
def masked_crc32c(buf, begin, end):
    """TFRecord's checksum of buf[begin:end]: CRC-32C, rotated right by 15 bits, plus a constant."""
    crc = _crc32c(buf, begin, end)
    rotated = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) & np.uint32(0xFFFFFFFF)
    return (np.uint64(rotated) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


def crc_matches(chunk, end):
    """Whether chunk[end:end + 4] holds the TFRecord checksum (masked CRC32C) of chunk[:end]."""
    stored = int.from_bytes(chunk[end:end + 4], "little")
    return stored == int(masked_crc32c(np.frombuffer(chunk, dtype=np.uint8), 0, end))


@compiled.jit()
def crc32c(buf):
    """Plain CRC-32C of a uint8 array (the token cache's chunk checksums)."""
    return _crc32c(buf, 0, buf.shape[0])
