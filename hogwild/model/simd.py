"""Explicit SIMD vectors inside numba kernels: a vector type and the few operations they need.

numba vectorises simple loops by itself, but not a register-blocked matrix-product kernel: that
needs a dozen accumulators that stay in registers across the whole reduction loop, which only
explicit vector values give. This module adds them as a numba type whose LLVM representation is
``<lanes x float>``, and intrinsics that emit the corresponding LLVM instructions:
loads and stores (unaligned; masked for the last, partial vector of a row), a broadcast load,
fused multiply-add, addition, subtraction, multiplication and the sum of a vector's lanes. LLVM
then selects the machine's instructions (AVX2 FMA on x86-64, AVX-512 where the host has it, NEON
on arm64) and allocates the registers.

The width is a property of the machine, decided once at import: 64 bytes where the host CPU has
AVX-512F, otherwise 32 (``HOGWILD_SIMD_BYTES`` overrides it, for tests). A vector holds
``width / 4`` float32 lanes: float32 is the engine's only float type (parameters, activations,
gradients), so a SIMD kernel typed for another float type is refused when it is compiled (a
float64 variant would be a whole second compile that no job runs, and that no test checks).

Indices are offsets into an array's data, in elements, and are never wrapped or bounds-checked:
the callers own the arithmetic.
"""

from __future__ import annotations

import os

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic, models, register_model


def _vector_bytes() -> int:
    forced = os.environ.get("HOGWILD_SIMD_BYTES")
    if forced:
        return int(forced)
    try:
        has_avx512 = bool(llvm.get_host_cpu_features().get("avx512f", False))
    except RuntimeError:  # features unknown on this host
        has_avx512 = False
    return 64 if has_avx512 else 32


VECTOR_BYTES = _vector_bytes()


class Vec(types.Type):
    """A SIMD vector of ``lanes`` floats of ``dtype`` (float32)."""

    def __init__(self, dtype, lanes: int):
        self.dtype = dtype
        self.lanes = lanes
        super().__init__(name=f"vec<{dtype}x{lanes}>")


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(_scalar_ir(fe_type.dtype), fe_type.lanes))


def _scalar_ir(dtype):
    return ir.FloatType()


def _vec_of(array_type) -> Vec:
    dtype = array_type.dtype
    if dtype != types.float32:
        raise TypeError(f"SIMD kernels take float32 arrays (the engine's float type), not {dtype}")
    return Vec(dtype, VECTOR_BYTES // 4)


def _ir_vec(vec: Vec):
    return ir.VectorType(_scalar_ir(vec.dtype), vec.lanes)


def _element_ptr(context, builder, array_type, array, index):
    if isinstance(array_type, types.CPointer):
        data = array
    else:
        data = context.make_array(array_type)(context, builder, array).data
    return builder.gep(data, [index])


@intrinsic
def data_ptr(typingctx, array):
    """The address of ``array``'s first element as a raw pointer of its float type.

    Kernels hand pointers, not arrays, to their inlined helpers: every array a helper receives is
    a reference numba counts (an atomic increment and decrement per call, in the innermost
    loops), and a pointer is not. The caller keeps the array alive while the pointer is used.
    """
    if not isinstance(array, types.Array) or array.dtype != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return context.make_array(sig.args[0])(context, builder, args[0]).data

    return types.CPointer(array.dtype)(array), codegen


def _vector_ptr(context, builder, array_type, array, index, vec):
    ptr = _element_ptr(context, builder, array_type, array, index)
    return builder.bitcast(ptr, ir.PointerType(_ir_vec(vec)))


def _lane_mask(builder, vec: Vec, count):
    """``<lanes x i1>``: lane i is on when i < count."""
    lanes = ir.Constant(ir.VectorType(ir.IntType(64), vec.lanes), list(range(vec.lanes)))
    n = builder.sext(count, ir.IntType(64)) if count.type.width < 64 else count
    splat = _splat(builder, n, ir.VectorType(ir.IntType(64), vec.lanes))
    return builder.icmp_signed("<", lanes, splat)


def _splat(builder, scalar, vector_type):
    undef = ir.Constant(vector_type, ir.Undefined)
    first = builder.insert_element(undef, scalar, ir.Constant(ir.IntType(32), 0))
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(first, undef, zeros)


def _call(builder, name, return_type, args, fastmath=()):
    fn_type = ir.FunctionType(return_type, [a.type for a in args])
    fn = cgutils.get_or_insert_function(builder.module, fn_type, name)
    return builder.call(fn, args, fastmath=fastmath)


def _suffix(vec: Vec) -> str:
    return f"v{vec.lanes}f32"


@intrinsic
def lanes(typingctx, array):
    """The number of lanes of a vector of ``array``'s float type (a compile-time constant)."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, vec.lanes)

    return types.intp(array), codegen


@intrinsic
def vzero(typingctx, array):
    """A vector of zeros of ``array``'s float type."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        return ir.Constant(_ir_vec(vec), [0.0] * vec.lanes)

    return vec(array), codegen


@intrinsic
def vload(typingctx, array, index):
    """``array[index : index + lanes]`` as a vector (unaligned)."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1], vec)
        return builder.load(ptr, align=sig.args[0].dtype.bitwidth // 8)

    return vec(array, index), codegen


@intrinsic
def vload_n(typingctx, array, index, count):
    """The first ``count`` lanes from ``array[index:]``, zeros after: nothing beyond is read."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1], vec)
        mask = _lane_mask(builder, vec, args[2])
        align = ir.Constant(ir.IntType(32), sig.args[0].dtype.bitwidth // 8)
        zero = ir.Constant(_ir_vec(vec), [0.0] * vec.lanes)
        name = f"llvm.masked.load.{_suffix(vec)}.p0"
        return _call(builder, name, _ir_vec(vec), [ptr, align, mask, zero])

    return vec(array, index, count), codegen


@intrinsic
def vstore(typingctx, array, index, value):
    """``array[index : index + lanes] = value`` (unaligned)."""

    def codegen(context, builder, sig, args):
        ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1], sig.args[2])
        builder.store(args[2], ptr, align=sig.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def vstore_n(typingctx, array, index, value, count):
    """Store the first ``count`` lanes of ``value`` at ``array[index:]``, and nothing else."""

    def codegen(context, builder, sig, args):
        vec = sig.args[2]
        ptr = _vector_ptr(context, builder, sig.args[0], args[0], args[1], vec)
        mask = _lane_mask(builder, vec, args[3])
        align = ir.Constant(ir.IntType(32), sig.args[0].dtype.bitwidth // 8)
        name = f"llvm.masked.store.{_suffix(vec)}.p0"
        _call(builder, name, ir.VoidType(), [args[2], ptr, align, mask])
        return context.get_dummy_value()

    return types.void(array, index, value, count), codegen


@intrinsic
def vbload(typingctx, array, index):
    """``array[index]`` in every lane."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        ptr = _element_ptr(context, builder, sig.args[0], args[0], args[1])
        scalar = builder.load(ptr, align=sig.args[0].dtype.bitwidth // 8)
        return _splat(builder, scalar, _ir_vec(vec))

    return vec(array, index), codegen


@intrinsic
def vsplat(typingctx, array, value):
    """``value`` (any number, converted to ``array``'s float type) in every lane."""
    vec = _vec_of(array)

    def codegen(context, builder, sig, args):
        scalar = context.cast(builder, args[1], sig.args[1], vec.dtype)
        return _splat(builder, scalar, _ir_vec(vec))

    return vec(array, value), codegen


def _binary(op):
    @intrinsic
    def fn(typingctx, a, b):
        if not isinstance(a, Vec) or a != b:
            return None

        def codegen(context, builder, sig, args):
            result = getattr(builder, op)(args[0], args[1])
            return result

        return a(a, b), codegen

    return fn


vadd = _binary("fadd")
vsub = _binary("fsub")
vmul = _binary("fmul")


@intrinsic
def vfma(typingctx, a, b, c):
    """``a * b + c`` lane by lane (one fused instruction where the machine has it)."""
    if not isinstance(a, Vec) or not a == b == c:
        return None

    def codegen(context, builder, sig, args):
        return _call(builder, f"llvm.fmuladd.{_suffix(a)}", _ir_vec(a), list(args))

    return a(a, b, c), codegen


@intrinsic
def vhsum(typingctx, a):
    """The sum of the lanes (in any order: the lanes are a reduction's partial sums)."""
    if not isinstance(a, Vec):
        return None

    def codegen(context, builder, sig, args):
        scalar = _scalar_ir(a.dtype)
        zero = ir.Constant(scalar, 0.0)
        name = f"llvm.vector.reduce.fadd.{_suffix(a)}"
        return _call(builder, name, scalar, [zero, args[0]], fastmath=("reassoc",))

    return a.dtype(a), codegen
