"""ExecuTorch scalar type codes (identical to ``c10::ScalarType``), without torch."""

from __future__ import annotations

# code -> (name as ExecuTorch prints it, element size in bytes)
SCALAR_TYPES: dict[int, tuple[str, int]] = {
    0: ("Byte", 1),
    1: ("Char", 1),
    2: ("Short", 2),
    3: ("Int", 4),
    4: ("Long", 8),
    5: ("Half", 2),
    6: ("Float", 4),
    7: ("Double", 8),
    8: ("ComplexHalf", 4),
    9: ("ComplexFloat", 8),
    10: ("ComplexDouble", 16),
    11: ("Bool", 1),
    12: ("QInt8", 1),
    13: ("QUInt8", 1),
    14: ("QInt32", 4),
    15: ("BFloat16", 2),
    16: ("QUInt4x2", 1),
    17: ("QUInt2x4", 1),
    18: ("Bits1x8", 1),
    19: ("Bits2x4", 1),
    20: ("Bits4x2", 1),
    21: ("Bits8", 1),
    22: ("Bits16", 2),
    23: ("Float8_e5m2", 1),
    24: ("Float8_e4m3fn", 1),
    25: ("Float8_e5m2fnuz", 1),
    26: ("Float8_e4m3fnuz", 1),
    27: ("UInt16", 2),
    28: ("UInt32", 4),
    29: ("UInt64", 8),
}

BYTE = 0
LONG = 4
FLOAT = 6
DOUBLE = 7
BOOL = 11


def is_known(code: int) -> bool:
    return code in SCALAR_TYPES


def element_size(code: int) -> int:
    return SCALAR_TYPES[code][1]


def scalar_type_name(code: int) -> str:
    entry = SCALAR_TYPES.get(code)
    return entry[0] if entry else f"ScalarType({code})"
