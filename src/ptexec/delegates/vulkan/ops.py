"""The ops a Vulkan payload may name, and how ptexec runs each. Imports no torch.

The names are those of ExecuTorch's Vulkan op registry as the exporter writes them
(``aten.add.Tensor``; symbolic-integer ops by their Python name, ``add``). Most are ATen
ops whose serialized arguments are the op schema's, in order: ptexec calls the ATen op
itself (kind ``aten``). The others have their own rule in :mod:`.runtime`:

- ``prepack``: the exporter's marker that a constant is to be packed for the GPU; the value;
- ``sym``: symbolic integers (``sym_size.int`` and ``add``/``sub``/``mul``/``floordiv`` and
  the comparisons on them);
- ``dim_order``: ExecuTorch's dim-order copies (a dtype conversion; the memory layout is the
  GPU's business);
- ``custom``: ops whose arithmetic ptexec writes out (``conv_with_clamp``; the weight-only
  int8 linear, computed as the Vulkan shader does: the float input times the int8 weights,
  then the per-channel scales).

Ops in the registry that ptexec does not run (the Vulkan backend's own int8-activation and
4-bit kernels, attention with a KV cache, training steps) are absent: a payload naming
one is refused at load with the op's name (:class:`~ptexec.errors.BackendUnavailableError`).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

__all__ = ["OPS", "UNSUPPORTED", "OpSpec"]


@dataclass(frozen=True, slots=True)
class OpSpec:
    kind: str  # "aten", "prepack", "sym", "none", "dim_order", "custom"
    note: str = ""


_ATEN = """
abs.default cos.default exp.default gelu.default hardshrink.default hardswish.default
hardtanh.default neg.default relu.default sigmoid.default sin.default sqrt.default
rsqrt.default tanh.default round.default leaky_relu.default log10.default clamp.default
add.Tensor sub.Tensor minimum.default mul.Tensor div.Tensor div.Tensor_mode
pow.Tensor_Tensor eq.Tensor lt.Tensor le.Tensor gt.Tensor ge.Tensor bitwise_and.Tensor
bitwise_or.Tensor bitwise_not.default logical_and.default logical_or.default
pow.Tensor_Scalar eq.Scalar _to_copy.default _log_softmax.default _softmax.default
bmm.default mm.default addmm.default linear.default mean.dim sum.dim_IntList amax.default
amin.default argmax.default argmin.default avg_pool2d.default max_pool2d.default
max_pool2d_with_indices.default convolution.default permute.default permute_copy.default
view_copy.default squeeze_copy.dims unsqueeze_copy.default clone.default alias_copy.default
unfold_copy.default gather.default expand_copy.default cat.default select_copy.int
slice_copy.Tensor split_with_sizes_copy.default t_copy.default flip.default
index_select.default where.self index.Tensor arange.start_step constant_pad_nd.default
full.default full_like.default ones.default ones_like.default zeros.default
zeros_like.default scalar_tensor.default upsample_nearest2d.vec upsample_bilinear2d.vec
pixel_shuffle.default grid_sampler_2d.default repeat.default embedding.default
_native_batch_norm_legit_no_training.default native_group_norm.default
native_layer_norm.default ne.Scalar lt.Scalar le.Scalar ge.Scalar gt.Scalar
logical_not.default copy.default
"""

_NOTES = {
    "aten._to_copy.default": "the target dtype is the output's (the exporter writes dtype as null)",
    "aten.arange.start_step": "dtype and device from the output tensor",
    "aten.full.default": "dtype and device from the output tensor",
    "aten.max_pool2d_with_indices.default": "indices as int32, the payload's type",
    "aten.argmax.default": "int32 indices (the exporter narrows int64 to int32)",
    "aten.argmin.default": "int32 indices (the exporter narrows int64 to int32)",
}

_OTHERS: dict[str, OpSpec] = {
    "et_vk.prepack.default": OpSpec("prepack", "the constant itself (GPU packing only)"),
    "sym_size.int": OpSpec("sym", "the input's size"),
    "add": OpSpec("sym", "symbolic integers"),
    "sub": OpSpec("sym", "symbolic integers"),
    "mul": OpSpec("sym", "symbolic integers"),
    "floordiv": OpSpec("sym", "symbolic integers"),
    "lt": OpSpec("sym", "symbolic integers"),
    "gt": OpSpec("sym", "symbolic integers"),
    "ge": OpSpec("sym", "symbolic integers"),
    "le": OpSpec("sym", "symbolic integers"),
    "eq": OpSpec("sym", "symbolic integers"),
    "_assert_scalar.default": OpSpec("none", "checked by the exporter; nothing to run"),
    "sym_constrain_range_for_size.default": OpSpec("none", "nothing to run"),
    "dim_order_ops._to_dim_order_copy.default": OpSpec("dim_order", "a dtype conversion"),
    "dim_order_ops._clone_dim_order.default": OpSpec("dim_order", "a copy"),
    "et_vk.conv_with_clamp.default": OpSpec("custom", "convolution, then clamp"),
    "aten._weight_int8pack_mm.default": OpSpec(
        "custom", "float input x int8 weights, then per-channel scales (the shader's order)"
    ),
}

OPS: MappingProxyType[str, OpSpec] = MappingProxyType(
    {
        **{
            f"aten.{name}": OpSpec("aten", _NOTES.get(f"aten.{name}", "")) for name in _ATEN.split()
        },
        **_OTHERS,
    }
)

# in ExecuTorch's Vulkan op registry, not run by ptexec (refused at load with their name)
UNSUPPORTED: dict[str, str] = {
    "et_vk.linear_qcs4w.default": "4-bit weight linear",
    "et_vk.linear_q4gsw.default": "4-bit group-quantized linear",
    "et_vk.linear_dq8ca_q4gsw.default": "dynamically quantized activations, 4-bit weights",
    "et_vk.linear_q8ta_q8csw.default": "int8-activation linear",
    "et_vk.q8ta_linear.default": "int8-activation linear",
    "et_vk.q8ta_linear_gemv.default": "int8-activation linear",
    "et_vk.q8ta_conv2d.default": "int8-activation convolution",
    "et_vk.q8ta_conv2d_pw.default": "int8-activation convolution",
    "et_vk.q8ta_conv2d_dw.default": "int8-activation convolution",
    "et_vk.q8ta_conv2d_transposed.default": "int8-activation convolution",
    "et_vk.q8ta_add.default": "int8-activation add",
    "et_vk.q8ta_relu.default": "int8-activation relu",
    "et_vk.q8ta_pixel_shuffle.default": "int8-activation pixel shuffle",
    "et_vk.embedding_q4gsw.default": "4-bit embedding",
    "et_vk.sdpa": "attention",
    "llama::sdpa_with_kv_cache": "attention with a KV cache",
    "et_vk.apply_rotary_emb.default": "rotary embedding",
    "et_vk.rms_norm.default": "RMS norm",
    "et_vk.grid_priors.default": "grid priors",
    "quantized_decomposed.*": "quantize/dequantize inside the graph",
    "et_vk.linear_q4gsw_backward.default, et_vk.linear_dW.default, et_vk::adamw_step": "training",
}
