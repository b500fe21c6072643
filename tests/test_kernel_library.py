"""Kernel provenance (`kernel_library.classify`): a reviewed sample of real kernel names per
class, in the forms the three formats give them (demangled, mangled, bare). The counts over
every kernel name of the real corpus are checked in tests/test_diagnosis.py."""

from __future__ import annotations

import pyarrow as pa
import pytest

from traceanalyzer.kernel_library import BY_ID, LIBRARIES, classify, classify_arrow, is_library, markdown

# (name, mangled name or None, library): names as they appear in ../shared/traces
REVIEWED = [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", None, "nccl"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", None, "nccl"),
    ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
     "cutlass::bfloat16_t>>", None, "attention"),
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", None, "attention"),
    ("cudnn_generated_fort_native_sdpa_sm100_flash_fprop_f16_knob_7_32x128x128_4x1x1_cga1x1x1_kernel0_0", None,
     "attention"),
    ("void implicit_convolve_sgemm<float, float, 1024, 5, 5, 3, 3, 3, 1, false, true, true>(int, int, int)", None, "cudnn"),
    ("volta_scudnn_128x64_stridedB_interior_nn_v1", None, "cudnn"),
    ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize256x128x32_stage3", None, "cudnn"),
    ("cask_cudnn::computeOffsetsKernel(cask_cudnn::ComputeOffsetsParams)", None, "cudnn"),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionEEEvNT_6ParamsE", None, "cudnn"),
    ("igemm_fwd_gtcx2_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2", None, "cudnn"),
    # TensorRT's tactics: cuDNN- and cuBLAS-like names with the engine's `_trt` suffix or `trt_` prefix
    ("sm80_xmma_fprop_implicit_gemm_f16f16_f16f16_f16_nhwckrsc_nhwc_tilesize128x128x32_stage4_warpsize2x2x1_g1_"
     "tensor16x8x16_t1r3s3_aACCESS_execute_kernel_trt", None, "tensorrt"),
    ("trt_ampere_h16816gemm_64x64_ldg8_relu_stages_64x5_tn_v1", None, "tensorrt"),
    ("sm50_xmma_pooling_coalescedC_NHWC_kMAX_3_False_execute_kernel_trt", None, "tensorrt"),
    ("void fft2d_r2c_32x32<float, (bool)0, (unsigned int)5, (bool)0>(float2 *, const T1 *, int)", None, "cufft"),
    ("ampere_sgemm_128x64_nn", None, "cublas"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     None, "cublas"),
    ("nvjet_tst_144x128_64x6_2x1_v_bz_bias_TNN", None, "cublas"),
    ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x96x128_MI16x16x1_SN_LDSB1", None, "cublas"),
    ("void gemv2T_kernel_val<int, int, double, double, double, double, (int)128, (int)16>(cublasGemvParams)", None,
     "cublas"),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, true, false>", None, "cublas"),
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align1>(cutlass_80_tensorop_s1688gemm::Params)",
     None, "cutlass"),
    ("_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3", None, "cutlass"),
    ("triton_poi_fused__scaled_dot_product_flash_attention_cat_transpose_view_10", None, "triton"),
    ("triton__0d1d2d3d", None, "triton"),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false>", None, "cub"),
    ("void rocprim::ROCPRIM_400400_NS::detail::trampoline_kernel<rocprim::ROCPRIM_400400_NS::default_config>", None, "cub"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::WelfordOps<float, float, int, "
     "float, thrust::pair<float, float>>>>", None, "aten"),
    ("void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_float_to_hfp8_gpu(at::Tensor const&)>", None, "aten"),
    ("void <unnamed>::softmax_warp_forward<float, float, float, (int)6, (bool)0, (bool)0>(T2 *, const T1 *, int)", None,
     "aten"),
    ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float>(at::GenericPackedTensorAccessor)",
     None, "other"),
    ("void vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(c10::BFloat16*, c10::BFloat16 const*)", None, "other"),
    ("_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi256ELi16ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiiiib", None, "other"),
    ("cupy_multiply__float64_float64_float64", None, "other"),
    ("bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_"
     "biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f", None, "trtllm_gemm"),
    ("void moe::dev::routing::routingIndicesHistogramKernel<moe::dev::routing::routingRenormalize::KernelParams>", None,
     "other"),
    ("Fan2(float *, float *, float *, int, int, int)", None, "user"),
    ("sgemm_global_mem_coalesce(const float *, const float *, float *, int, int, int, float, float)", None, "user"),
    ("__pgi_uacc_cuda_fill_42_gpu", None, "user"),
    # a demangled name that says nothing, with the mangled one that does
    ("kernel", "_ZN7cutlass6KernelI19cutlass_80_tensoropEEvNT_6ParamsE", "cutlass"),
]


@pytest.mark.parametrize("name,mangled,library", REVIEWED, ids=[r[2] + ":" + r[0][:40] for r in REVIEWED])
def test_reviewed_real_names(name, mangled, library):
    assert classify(name, mangled) == library


def test_every_class_is_reviewed_and_documented():
    assert {lib for _, _, lib in REVIEWED} >= {lib.id for lib in LIBRARIES} - {"curand"}
    table = markdown()
    assert all(f"`{lib}`" in table for lib in BY_ID)


def test_placeholders_and_empty_names_have_no_library():
    assert classify(None) is None and classify("") is None and classify("[CUDA graph 3]") is None


def test_library_kernels_are_the_ones_the_user_cannot_recompile():
    assert is_library("cublas") and is_library("aten") and is_library("nccl")
    assert not is_library("user") and not is_library("triton") and not is_library(None)


def test_the_column_form_agrees_with_the_scalar_one_once_per_distinct_name():
    names = [n for n, _, _ in REVIEWED] * 3 + [None]
    mangled = [m for _, m, _ in REVIEWED] * 3 + [None]
    got = classify_arrow(pa.chunked_array([names]), pa.array(mangled)).to_pylist()
    assert got == [classify(n, m) for n, m in zip(names, mangled)]
    assert classify_arrow(pa.array(["ampere_sgemm_128x64_nn", "x"]).dictionary_encode()).to_pylist() == ["cublas", "user"]


@pytest.mark.parametrize("name,short,label", [
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align1>(cutlass_80_tensorop_s1688gemm::Params)",
     "Kernel", "Kernel<cutlass_80_tensorop_s1688gemm_128x256_32x3_nn_align1>"),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock",
     "_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock",
     "cutlass_cudnn_train::Kernel<ImplicitGemmConvolution>"),
    ("_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34GridwiseGemm", None,
     "kernel_grouped_conv_fwd_xdl_cshuffle_v3"),
    ("ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn", "ampere_sgemm_128x64_nn"),
    ("Kernel", "Kernel", "Kernel"),
])
def test_findings_name_kernels_by_what_tells_them_apart(name, short, label):
    """Rules' messages name a kernel by `fmt.kernel_label`: a generic base name (`Kernel`) gets
    its first template argument, a mangled one its last nested names."""
    from traceanalyzer.fmt import kernel_label

    assert kernel_label(name, short) == label
