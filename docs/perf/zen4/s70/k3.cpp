cpp_fused___and_____lshift_____or____to_copy_abs_add_amax_amin_arange_broadcast_tensors_clamp_div_embedding_eq_exp_expand_gather_ge_gemv_gt_index_put_log_lt_mul_pad_remainder_round_select_slice_squeeze_stack_sub_sum_transpose_unsqueeze_view_where_3 = async_compile.cpp_pybinding(['const float*', 'const float*', 'const int64_t*', 'const at::BFloat16*', 'const at::BFloat16*', 'const int32_t*', 'const float*', 'const float*', 'const float*', 'float*', 'float*', 'float*', 'int32_t*', 'float*', 'int32_t*', 'int32_t*', 'int32_t*', 'int32_t*', 'int32_t*', 'int32_t*', 'int32_t*', 'float*', 'int32_t*', 'int32_t*', 'int32_t*', 'int32_t*', 'at::BFloat16*'], r'''
#include <torch/csrc/inductor/aoti_runtime/utils.h>
#include <torch/csrc/inductor/cpp_prefix.h>
extern "C"  void  kernel(const float* in_ptr0,
                       const float* in_ptr1,
                       const int64_t* in_ptr2,
                       const at::BFloat16* in_ptr3,
                       const at::BFloat16* in_ptr4,
                       const int32_t* in_ptr5,
                       const float* in_ptr6,
                       const float* in_ptr7,
                       const float* in_ptr8,
                       float* out_ptr0,
                       float* out_ptr1,
                       float* out_ptr2,
                       int32_t* out_ptr3,
                       float* out_ptr4,
                       int32_t* out_ptr5,
                       int32_t* out_ptr6,
                       int32_t* out_ptr7,
                       int32_t* out_ptr8,
                       int32_t* out_ptr9,
                       int32_t* out_ptr10,
                       int32_t* out_ptr11,
                       float* out_ptr12,
                       int32_t* out_ptr13,
                       int32_t* out_ptr14,
                       int32_t* out_ptr15,
                       int32_t* out_ptr16,
                       at::BFloat16* out_ptr17)
{
    std::atomic<int> inductor_cpu_integer_div_error{0};
    inductor_cpu_integer_div_error_flag = &inductor_cpu_integer_div_error;
    torch::aot_inductor::RAIIAtenRecordFunctionHandle record_cpp_fused___and_____lshift_____or____to_copy_abs_add_amax_amin_arange_broadcast_tensors_clamp_div_embedding_eq_exp_expand_gather_ge_gemv_gt_index_put_log_lt_mul_pad_remainder_round_select_slice_squeeze_stack_sub_sum_transpose_unsqueeze_view_where_3_("cpp_fused___and_____lshift_____or____to_copy_abs_add_amax_amin_arange_broadcast_tensors_clamp_div_embedding_eq_exp_expand_gather_ge_gemv_gt_index_put_log_lt_mul_pad_remainder_round_select_slice_squeeze_stack_sub_sum_transpose_unsqueeze_view_where_3", nullptr);
    {
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(9L); x0+=static_cast<int64_t>(16L))
        {
            {
                if(C10_LIKELY(x0 >= static_cast<int64_t>(0L) && x0 < static_cast<int64_t>(9L)))
                {
                    auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr0 + static_cast<int64_t>(x0), static_cast<int64_t>(9L));
                    tmp0.store(out_ptr0 + static_cast<int64_t>(x0), static_cast<int64_t>(9L));
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(2L); x0+=static_cast<int64_t>(1L))
        {
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(9L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0L) && x1 < static_cast<int64_t>(9L)))
                    {
                        auto tmp0 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1 + 9L*x0), static_cast<int64_t>(9L));
                        auto tmp1 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(x1), static_cast<int64_t>(9L));
                        auto tmp2 = at::vec::Vectorized<float>::loadu(in_ptr1 + static_cast<int64_t>(9L + x1), static_cast<int64_t>(9L));
                        auto tmp3 = at::vec::maximum(tmp1, tmp2);
                        auto tmp4 = tmp0 - tmp3;
                        auto tmp5 = tmp4.exp();
                        tmp5.store(out_ptr1 + static_cast<int64_t>(x1 + 9L*x0), static_cast<int64_t>(9L));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
        {
            {
                float tmp_acc0 = -std::numeric_limits<float>::infinity();
                at::vec::VectorizedN<float,2> tmp_acc0_vec = at::vec::VectorizedN<float,2>(-std::numeric_limits<float>::infinity());
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(64L); x1+=static_cast<int64_t>(32L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(64L)))
                        {
                            auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                            auto tmp1 = static_cast<int64_t>(124);
                            auto tmp2 = int64_t(tmp0 - tmp1);
                            auto tmp3 = static_cast<int64_t>(4);
                            auto tmp4 = max_propagate_nan(tmp2, tmp3);
                            auto tmp5 = tmp4 < tmp3;
                            auto tmp6 = int64_t(tmp4 - tmp3);
                            auto tmp7 = static_cast<int64_t>(156);
                            auto tmp8 = mod(tmp6, tmp7);
                            auto tmp9 = static_cast<int32_t>(0);
                            auto tmp10 = tmp8 != tmp9;
                            auto tmp11 = std::signbit(tmp8);
                            auto tmp12 = std::signbit(tmp7);
                            auto tmp13 = tmp11 != tmp12;
                            auto tmp14 = tmp10 & tmp13;
                            auto tmp15 = int64_t(tmp8 + tmp7);
                            auto tmp16 = tmp14 ? tmp15 : tmp8;
                            auto tmp17 = int64_t(tmp16 + tmp3);
                            auto tmp18 = tmp5 ? tmp4 : tmp17;
                            auto tmp19 = tmp18;
                            auto tmp20 = c10::convert<int64_t>(tmp19);
                            TORCH_CHECK((0 <= tmp20) & (tmp20 < 160L), "index out of bounds: 0 <= tmp20 < 160L");
                            auto tmp22 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr3 + static_cast<int64_t>(x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(32));
                            auto tmp23 = at::vec::convert<float,2,at::BFloat16,1>(tmp22);
                            auto tmp24 = tmp23.abs();
                            tmp_acc0_vec = at::vec::maximum(tmp_acc0_vec, tmp24);
                        }
                    }
                }
                tmp_acc0 = max_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<float, 2>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return at::vec::maximum(x, y); }, tmp_acc0_vec));
                out_ptr2[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
            }
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(16L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L)))
                    {
                        auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                        auto tmp24 = out_ptr2[static_cast<int64_t>(x0)];
                        auto tmp1 = static_cast<int64_t>(124);
                        auto tmp2 = int64_t(tmp0 - tmp1);
                        auto tmp3 = static_cast<int64_t>(4);
                        auto tmp4 = max_propagate_nan(tmp2, tmp3);
                        auto tmp5 = tmp4 < tmp3;
                        auto tmp6 = int64_t(tmp4 - tmp3);
                        auto tmp7 = static_cast<int64_t>(156);
                        auto tmp8 = mod(tmp6, tmp7);
                        auto tmp9 = static_cast<int32_t>(0);
                        auto tmp10 = tmp8 != tmp9;
                        auto tmp11 = std::signbit(tmp8);
                        auto tmp12 = std::signbit(tmp7);
                        auto tmp13 = tmp11 != tmp12;
                        auto tmp14 = tmp10 & tmp13;
                        auto tmp15 = int64_t(tmp8 + tmp7);
                        auto tmp16 = tmp14 ? tmp15 : tmp8;
                        auto tmp17 = int64_t(tmp16 + tmp3);
                        auto tmp18 = tmp5 ? tmp4 : tmp17;
                        auto tmp19 = tmp18;
                        auto tmp20 = c10::convert<int64_t>(tmp19);
                        TORCH_CHECK((0 <= tmp20) & (tmp20 < 160L), "index out of bounds: 0 <= tmp20 < 160L");
                        auto tmp22 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr3 + static_cast<int64_t>(x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp23 = at::vec::convert<float>(tmp22);
                        auto tmp25 = static_cast<float>(127.0);
                        auto tmp26 = tmp24 / tmp25;
                        auto tmp27 = static_cast<float>(1e-08);
                        auto tmp28 = float(tmp26 + tmp27);
                        auto tmp29 = at::vec::Vectorized<float>(tmp28);
                        auto tmp30 = tmp23 / tmp29;
                        auto tmp31 = tmp30.round();
                        auto tmp32 = static_cast<float>(-127.0);
                        auto tmp33 = at::vec::Vectorized<float>(tmp32);
                        auto tmp34 = at::vec::maximum(tmp31, tmp33);
                        auto tmp35 = at::vec::Vectorized<float>(tmp25);
                        auto tmp36 = at::vec::minimum(tmp34, tmp35);
                        auto tmp37 = at::vec::convert<int8_t>(tmp36);
                        auto tmp38 = at::vec::convert<int32_t>(tmp37);
                        auto tmp39 = static_cast<int32_t>(255);
                        auto tmp40 = at::vec::Vectorized<int32_t>(tmp39);
                        auto tmp41 = tmp38 & tmp40;
                        auto tmp42 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr3 + static_cast<int64_t>(16L + x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp43 = at::vec::convert<float>(tmp42);
                        auto tmp44 = tmp43 / tmp29;
                        auto tmp45 = tmp44.round();
                        auto tmp46 = at::vec::maximum(tmp45, tmp33);
                        auto tmp47 = at::vec::minimum(tmp46, tmp35);
                        auto tmp48 = at::vec::convert<int8_t>(tmp47);
                        auto tmp49 = at::vec::convert<int32_t>(tmp48);
                        auto tmp50 = tmp49 & tmp40;
                        auto tmp51 = static_cast<int32_t>(8);
                        auto tmp52 = at::vec::Vectorized<int32_t>(tmp51);
                        auto tmp53 = tmp50 << tmp52;
                        auto tmp54 = tmp41 | tmp53;
                        auto tmp55 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr3 + static_cast<int64_t>(32L + x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp56 = at::vec::convert<float>(tmp55);
                        auto tmp57 = tmp56 / tmp29;
                        auto tmp58 = tmp57.round();
                        auto tmp59 = at::vec::maximum(tmp58, tmp33);
                        auto tmp60 = at::vec::minimum(tmp59, tmp35);
                        auto tmp61 = at::vec::convert<int8_t>(tmp60);
                        auto tmp62 = at::vec::convert<int32_t>(tmp61);
                        auto tmp63 = tmp62 & tmp40;
                        auto tmp64 = static_cast<int32_t>(16);
                        auto tmp65 = at::vec::Vectorized<int32_t>(tmp64);
                        auto tmp66 = tmp63 << tmp65;
                        auto tmp67 = tmp54 | tmp66;
                        tmp67.store(out_ptr3 + static_cast<int64_t>(x1 + 16L*x0), static_cast<int64_t>(16));
                    }
                }
            }
        }
    }
    {
        #pragma GCC ivdep
        for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
        {
            {
                float tmp_acc0 = -std::numeric_limits<float>::infinity();
                at::vec::VectorizedN<float,2> tmp_acc0_vec = at::vec::VectorizedN<float,2>(-std::numeric_limits<float>::infinity());
                for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(64L); x1+=static_cast<int64_t>(32L))
                {
                    {
                        if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(64L)))
                        {
                            auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                            auto tmp1 = static_cast<int64_t>(124);
                            auto tmp2 = int64_t(tmp0 - tmp1);
                            auto tmp3 = static_cast<int64_t>(4);
                            auto tmp4 = max_propagate_nan(tmp2, tmp3);
                            auto tmp5 = tmp4 < tmp3;
                            auto tmp6 = int64_t(tmp4 - tmp3);
                            auto tmp7 = static_cast<int64_t>(156);
                            auto tmp8 = mod(tmp6, tmp7);
                            auto tmp9 = static_cast<int32_t>(0);
                            auto tmp10 = tmp8 != tmp9;
                            auto tmp11 = std::signbit(tmp8);
                            auto tmp12 = std::signbit(tmp7);
                            auto tmp13 = tmp11 != tmp12;
                            auto tmp14 = tmp10 & tmp13;
                            auto tmp15 = int64_t(tmp8 + tmp7);
                            auto tmp16 = tmp14 ? tmp15 : tmp8;
                            auto tmp17 = int64_t(tmp16 + tmp3);
                            auto tmp18 = tmp5 ? tmp4 : tmp17;
                            auto tmp19 = tmp18;
                            auto tmp20 = c10::convert<int64_t>(tmp19);
                            TORCH_CHECK((0 <= tmp20) & (tmp20 < 160L), "index out of bounds: 0 <= tmp20 < 160L");
                            auto tmp22 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(32));
                            auto tmp23 = at::vec::convert<float,2,at::BFloat16,1>(tmp22);
                            auto tmp24 = tmp23.abs();
                            tmp_acc0_vec = at::vec::maximum(tmp_acc0_vec, tmp24);
                        }
                    }
                }
                tmp_acc0 = max_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<float, 2>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return at::vec::maximum(x, y); }, tmp_acc0_vec));
                out_ptr4[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
            }
            for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(16L); x1+=static_cast<int64_t>(16L))
            {
                {
                    if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L)))
                    {
                        auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                        auto tmp24 = out_ptr4[static_cast<int64_t>(x0)];
                        auto tmp1 = static_cast<int64_t>(124);
                        auto tmp2 = int64_t(tmp0 - tmp1);
                        auto tmp3 = static_cast<int64_t>(4);
                        auto tmp4 = max_propagate_nan(tmp2, tmp3);
                        auto tmp5 = tmp4 < tmp3;
                        auto tmp6 = int64_t(tmp4 - tmp3);
                        auto tmp7 = static_cast<int64_t>(156);
                        auto tmp8 = mod(tmp6, tmp7);
                        auto tmp9 = static_cast<int32_t>(0);
                        auto tmp10 = tmp8 != tmp9;
                        auto tmp11 = std::signbit(tmp8);
                        auto tmp12 = std::signbit(tmp7);
                        auto tmp13 = tmp11 != tmp12;
                        auto tmp14 = tmp10 & tmp13;
                        auto tmp15 = int64_t(tmp8 + tmp7);
                        auto tmp16 = tmp14 ? tmp15 : tmp8;
                        auto tmp17 = int64_t(tmp16 + tmp3);
                        auto tmp18 = tmp5 ? tmp4 : tmp17;
                        auto tmp19 = tmp18;
                        auto tmp20 = c10::convert<int64_t>(tmp19);
                        TORCH_CHECK((0 <= tmp20) & (tmp20 < 160L), "index out of bounds: 0 <= tmp20 < 160L");
                        auto tmp22 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr4 + static_cast<int64_t>(x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp23 = at::vec::convert<float>(tmp22);
                        auto tmp25 = static_cast<float>(127.0);
                        auto tmp26 = tmp24 / tmp25;
                        auto tmp27 = static_cast<float>(1e-08);
                        auto tmp28 = float(tmp26 + tmp27);
                        auto tmp29 = at::vec::Vectorized<float>(tmp28);
                        auto tmp30 = tmp23 / tmp29;
                        auto tmp31 = tmp30.round();
                        auto tmp32 = static_cast<float>(-127.0);
                        auto tmp33 = at::vec::Vectorized<float>(tmp32);
                        auto tmp34 = at::vec::maximum(tmp31, tmp33);
                        auto tmp35 = at::vec::Vectorized<float>(tmp25);
                        auto tmp36 = at::vec::minimum(tmp34, tmp35);
                        auto tmp37 = at::vec::convert<int8_t>(tmp36);
                        auto tmp38 = at::vec::convert<int32_t>(tmp37);
                        auto tmp39 = static_cast<int32_t>(255);
                        auto tmp40 = at::vec::Vectorized<int32_t>(tmp39);
                        auto tmp41 = tmp38 & tmp40;
                        auto tmp42 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr4 + static_cast<int64_t>(16L + x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp43 = at::vec::convert<float>(tmp42);
                        auto tmp44 = tmp43 / tmp29;
                        auto tmp45 = tmp44.round();
                        auto tmp46 = at::vec::maximum(tmp45, tmp33);
                        auto tmp47 = at::vec::minimum(tmp46, tmp35);
                        auto tmp48 = at::vec::convert<int8_t>(tmp47);
                        auto tmp49 = at::vec::convert<int32_t>(tmp48);
                        auto tmp50 = tmp49 & tmp40;
                        auto tmp51 = static_cast<int32_t>(8);
                        auto tmp52 = at::vec::Vectorized<int32_t>(tmp51);
                        auto tmp53 = tmp50 << tmp52;
                        auto tmp54 = tmp41 | tmp53;
                        auto tmp55 = at::vec::Vectorized<at::BFloat16>::loadu(in_ptr4 + static_cast<int64_t>(32L + x1 + 64L*tmp18 + 10240L*x0), static_cast<int64_t>(16));
                        auto tmp56 = at::vec::convert<float>(tmp55);
                        auto tmp57 = tmp56 / tmp29;
                        auto tmp58 = tmp57.round();
                        auto tmp59 = at::vec::maximum(tmp58, tmp33);
                        auto tmp60 = at::vec::minimum(tmp59, tmp35);
                        auto tmp61 = at::vec::convert<int8_t>(tmp60);
                        auto tmp62 = at::vec::convert<int32_t>(tmp61);
                        auto tmp63 = tmp62 & tmp40;
                        auto tmp64 = static_cast<int32_t>(16);
                        auto tmp65 = at::vec::Vectorized<int32_t>(tmp64);
                        auto tmp66 = tmp63 << tmp65;
                        auto tmp67 = tmp54 | tmp66;
                        tmp67.store(out_ptr5 + static_cast<int64_t>(x1 + 16L*x0), static_cast<int64_t>(16));
                    }
                }
            }
        }
    }
    #pragma omp parallel
    {
        int tid = omp_get_thread_num();
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
            {
                {
                    int32_t tmp_acc0 = std::numeric_limits<int32_t>::max();
                    at::vec::Vectorized<int32_t> tmp_acc0_vec = at::vec::Vectorized<int32_t>(std::numeric_limits<int32_t>::max());
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4181L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(4176L)))
                            {
                                auto tmp0 = at::vec::Vectorized<int32_t>::loadu(in_ptr5 + static_cast<int64_t>(160L + x1 + 4341L*x0), static_cast<int64_t>(16));
                                auto tmp1 = static_cast<int32_t>(0);
                                auto tmp2 = at::vec::Vectorized<int32_t>(tmp1);
                                auto tmp3 = at::vec::VecMask<int32_t,1>(tmp0 < tmp2);
                                auto tmp4 = x1;
                                auto tmp5 = c10::convert<int32_t>(tmp4);
                                auto tmp6 = at::vec::Vectorized<int32_t>::arange(tmp5, 1);
                                auto tmp7 = static_cast<int32_t>(4181);
                                auto tmp8 = at::vec::Vectorized<int32_t>(tmp7);
                                auto tmp9 = decltype(tmp6)::blendv(tmp8, tmp6, tmp3.template cast<int32_t,1>());
                                tmp_acc0_vec = at::vec::minimum(tmp_acc0_vec, tmp9);
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(4176L) && x1 < static_cast<int64_t>(4181L)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(4176L);x1_tail < static_cast<int64_t>(4181L); x1_tail++)
                                {
                                    auto tmp0 = in_ptr5[static_cast<int64_t>(160L + x1_tail + 4341L*x0)];
                                    auto tmp1 = static_cast<int32_t>(0);
                                    auto tmp2 = tmp0 < tmp1;
                                    auto tmp3 = x1_tail;
                                    auto tmp4 = c10::convert<int32_t>(tmp3);
                                    auto tmp5 = static_cast<int32_t>(4181);
                                    auto tmp6 = tmp2 ? tmp4 : tmp5;
                                    tmp_acc0 = min_propagate_nan(tmp_acc0, tmp6);
                                }
                            }
                        }
                    }
                    tmp_acc0 = min_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<int32_t, 1>([](at::vec::Vectorized<int32_t>& x, at::vec::Vectorized<int32_t>& y) { return at::vec::minimum(x, y); }, tmp_acc0_vec));
                    out_ptr6[static_cast<int64_t>(x0)] = static_cast<int32_t>(tmp_acc0);
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
                {
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(17L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(16L)))
                            {
                                auto tmp0 = out_ptr6[static_cast<int64_t>(x0)];
                                auto tmp26 = out_ptr2[static_cast<int64_t>(x0)];
                                auto tmp77 = out_ptr4[static_cast<int64_t>(x0)];
                                auto tmp1 = static_cast<int32_t>(4181);
                                auto tmp2 = mod(tmp0, tmp1);
                                auto tmp3 = static_cast<int32_t>(0);
                                auto tmp4 = tmp2 != tmp3;
                                auto tmp5 = std::signbit(tmp2);
                                auto tmp6 = std::signbit(tmp1);
                                auto tmp7 = tmp5 != tmp6;
                                auto tmp8 = tmp4 & tmp7;
                                auto tmp9 = int32_t(tmp2 + tmp1);
                                auto tmp10 = tmp8 ? tmp9 : tmp2;
                                auto tmp11 = c10::convert<int64_t>(tmp10);
                                auto tmp12 = 4181L;
                                auto tmp13 = c10::convert<int64_t>(tmp12);
                                auto tmp14 = int64_t(tmp11 + tmp13);
                                auto tmp15 = tmp11 < 0;
                                auto tmp16 = tmp15 ? tmp14 : tmp11;
                                auto tmp17 = tmp16;
                                auto tmp18 = c10::convert<int64_t>(tmp17);
                                TORCH_CHECK((0 <= tmp18) & (tmp18 < 4181L), "index out of bounds: 0 <= tmp18 < 4181L");
                                auto tmp20 = x1;
                                auto tmp21 = c10::convert<int64_t>(tmp20);
                                auto tmp22 = at::vec::VectorizedN<int64_t,2>::arange(tmp21, 1);
                                auto tmp23 = static_cast<int64_t>(16);
                                auto tmp24 = at::vec::VectorizedN<int64_t,2>(tmp23);
                                auto tmp25 = at::vec::VecMask<int64_t,2>(tmp22 == tmp24);
                                auto tmp27 = static_cast<float>(127.0);
                                auto tmp28 = tmp26 / tmp27;
                                auto tmp29 = static_cast<float>(1e-08);
                                auto tmp30 = float(tmp28 + tmp29);
                                auto tmp31 = c10::bit_cast<int32_t>(tmp30);
                                auto tmp32 = at::vec::VecMask<int64_t,2>(tmp22 < tmp24);
                                auto tmp33 = [&]
                                {
                                    auto tmp34 = tmp32.template cast<float,1>().template loadu<int32_t,1>(out_ptr3 + static_cast<int64_t>(x1 + 16L*x0));
                                    auto tmp35 = in_ptr2[static_cast<int64_t>(0L)];
                                    auto tmp36 = static_cast<int64_t>(124);
                                    auto tmp37 = int64_t(tmp35 - tmp36);
                                    auto tmp38 = static_cast<int64_t>(4);
                                    auto tmp39 = max_propagate_nan(tmp37, tmp38);
                                    auto tmp40 = tmp39 < tmp38;
                                    auto tmp41 = int64_t(tmp39 - tmp38);
                                    auto tmp42 = static_cast<int64_t>(156);
                                    auto tmp43 = mod(tmp41, tmp42);
                                    auto tmp44 = tmp43 != tmp3;
                                    auto tmp45 = std::signbit(tmp43);
                                    auto tmp46 = std::signbit(tmp42);
                                    auto tmp47 = tmp45 != tmp46;
                                    auto tmp48 = tmp44 & tmp47;
                                    auto tmp49 = int64_t(tmp43 + tmp42);
                                    auto tmp50 = tmp48 ? tmp49 : tmp43;
                                    auto tmp51 = int64_t(tmp50 + tmp38);
                                    auto tmp52 = tmp40 ? tmp39 : tmp51;
                                    auto tmp53 = tmp52;
                                    auto tmp54 = c10::convert<int64_t>(tmp53);
                                    TORCH_CHECK(((0 <= tmp54) & (tmp54 < 160L)) | ~((tmp32).all_masked()), "index out of bounds: 0 <= tmp54 < 160L");
                                    auto tmp56 = tmp32.template cast<float,1>().template loadu<at::BFloat16,1>(in_ptr3 + static_cast<int64_t>(48L + x1 + 64L*tmp52 + 10240L*x0));
                                    auto tmp57 = at::vec::convert<float>(tmp56);
                                    auto tmp58 = at::vec::Vectorized<float>(tmp30);
                                    auto tmp59 = tmp57 / tmp58;
                                    auto tmp60 = tmp59.round();
                                    auto tmp61 = static_cast<float>(-127.0);
                                    auto tmp62 = at::vec::Vectorized<float>(tmp61);
                                    auto tmp63 = at::vec::maximum(tmp60, tmp62);
                                    auto tmp64 = at::vec::Vectorized<float>(tmp27);
                                    auto tmp65 = at::vec::minimum(tmp63, tmp64);
                                    auto tmp66 = at::vec::convert<int8_t>(tmp65);
                                    auto tmp67 = at::vec::convert<int32_t>(tmp66);
                                    auto tmp68 = static_cast<int32_t>(16777216);
                                    auto tmp69 = at::vec::Vectorized<int32_t>(tmp68);
                                    auto tmp70 = tmp67 * tmp69;
                                    auto tmp71 = tmp34 | tmp70;
                                    return tmp71;
                                }
                                ;
                                auto tmp74 =
                                [&]
                                {
                                    if (tmp32.all_zero())
                                    {
                                        return at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                    }
                                    else
                                    {
                                        auto tmp72 = tmp33();
                                        auto tmp73 = at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                        return decltype(tmp72)::blendv(tmp73, tmp72, tmp32.template cast<int32_t,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp75 = at::vec::Vectorized<int32_t>(tmp31);
                                auto tmp76 = decltype(tmp75)::blendv(tmp74, tmp75, tmp25.template cast<int32_t,1>());
                                auto tmp78 = tmp77 / tmp27;
                                auto tmp79 = float(tmp78 + tmp29);
                                auto tmp80 = c10::bit_cast<int32_t>(tmp79);
                                auto tmp81 = [&]
                                {
                                    auto tmp82 = tmp32.template cast<float,1>().template loadu<int32_t,1>(out_ptr5 + static_cast<int64_t>(x1 + 16L*x0));
                                    auto tmp83 = in_ptr2[static_cast<int64_t>(0L)];
                                    auto tmp84 = static_cast<int64_t>(124);
                                    auto tmp85 = int64_t(tmp83 - tmp84);
                                    auto tmp86 = static_cast<int64_t>(4);
                                    auto tmp87 = max_propagate_nan(tmp85, tmp86);
                                    auto tmp88 = tmp87 < tmp86;
                                    auto tmp89 = int64_t(tmp87 - tmp86);
                                    auto tmp90 = static_cast<int64_t>(156);
                                    auto tmp91 = mod(tmp89, tmp90);
                                    auto tmp92 = tmp91 != tmp3;
                                    auto tmp93 = std::signbit(tmp91);
                                    auto tmp94 = std::signbit(tmp90);
                                    auto tmp95 = tmp93 != tmp94;
                                    auto tmp96 = tmp92 & tmp95;
                                    auto tmp97 = int64_t(tmp91 + tmp90);
                                    auto tmp98 = tmp96 ? tmp97 : tmp91;
                                    auto tmp99 = int64_t(tmp98 + tmp86);
                                    auto tmp100 = tmp88 ? tmp87 : tmp99;
                                    auto tmp101 = tmp100;
                                    auto tmp102 = c10::convert<int64_t>(tmp101);
                                    TORCH_CHECK(((0 <= tmp102) & (tmp102 < 160L)) | ~((tmp32).all_masked()), "index out of bounds: 0 <= tmp102 < 160L");
                                    auto tmp104 = tmp32.template cast<float,1>().template loadu<at::BFloat16,1>(in_ptr4 + static_cast<int64_t>(48L + x1 + 64L*tmp100 + 10240L*x0));
                                    auto tmp105 = at::vec::convert<float>(tmp104);
                                    auto tmp106 = at::vec::Vectorized<float>(tmp79);
                                    auto tmp107 = tmp105 / tmp106;
                                    auto tmp108 = tmp107.round();
                                    auto tmp109 = static_cast<float>(-127.0);
                                    auto tmp110 = at::vec::Vectorized<float>(tmp109);
                                    auto tmp111 = at::vec::maximum(tmp108, tmp110);
                                    auto tmp112 = at::vec::Vectorized<float>(tmp27);
                                    auto tmp113 = at::vec::minimum(tmp111, tmp112);
                                    auto tmp114 = at::vec::convert<int8_t>(tmp113);
                                    auto tmp115 = at::vec::convert<int32_t>(tmp114);
                                    auto tmp116 = static_cast<int32_t>(16777216);
                                    auto tmp117 = at::vec::Vectorized<int32_t>(tmp116);
                                    auto tmp118 = tmp115 * tmp117;
                                    auto tmp119 = tmp82 | tmp118;
                                    return tmp119;
                                }
                                ;
                                auto tmp122 =
                                [&]
                                {
                                    if (tmp32.all_zero())
                                    {
                                        return at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                    }
                                    else
                                    {
                                        auto tmp120 = tmp81();
                                        auto tmp121 = at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                        return decltype(tmp120)::blendv(tmp121, tmp120, tmp32.template cast<int32_t,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp123 = at::vec::Vectorized<int32_t>(tmp80);
                                auto tmp124 = decltype(tmp123)::blendv(tmp122, tmp123, tmp25.template cast<int32_t,1>());
                                tmp76.store(out_ptr7 + static_cast<int64_t>(x1 + 17L*tmp16 + 71077L*x0), static_cast<int64_t>(16));
                                tmp124.store(out_ptr8 + static_cast<int64_t>(x1 + 17L*tmp16 + 71077L*x0), static_cast<int64_t>(16));
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(16L) && x1 < static_cast<int64_t>(17L)))
                            {
                                auto tmp0 = out_ptr6[static_cast<int64_t>(x0)];
                                auto tmp26 = out_ptr2[static_cast<int64_t>(x0)];
                                auto tmp77 = out_ptr4[static_cast<int64_t>(x0)];
                                auto tmp1 = static_cast<int32_t>(4181);
                                auto tmp2 = mod(tmp0, tmp1);
                                auto tmp3 = static_cast<int32_t>(0);
                                auto tmp4 = tmp2 != tmp3;
                                auto tmp5 = std::signbit(tmp2);
                                auto tmp6 = std::signbit(tmp1);
                                auto tmp7 = tmp5 != tmp6;
                                auto tmp8 = tmp4 & tmp7;
                                auto tmp9 = int32_t(tmp2 + tmp1);
                                auto tmp10 = tmp8 ? tmp9 : tmp2;
                                auto tmp11 = c10::convert<int64_t>(tmp10);
                                auto tmp12 = 4181L;
                                auto tmp13 = c10::convert<int64_t>(tmp12);
                                auto tmp14 = int64_t(tmp11 + tmp13);
                                auto tmp15 = tmp11 < 0;
                                auto tmp16 = tmp15 ? tmp14 : tmp11;
                                auto tmp17 = tmp16;
                                auto tmp18 = c10::convert<int64_t>(tmp17);
                                TORCH_CHECK((0 <= tmp18) & (tmp18 < 4181L), "index out of bounds: 0 <= tmp18 < 4181L");
                                auto tmp20 = x1;
                                auto tmp21 = c10::convert<int64_t>(tmp20);
                                auto tmp22 = at::vec::VectorizedN<int64_t,2>::arange(tmp21, 1);
                                auto tmp23 = static_cast<int64_t>(16);
                                auto tmp24 = at::vec::VectorizedN<int64_t,2>(tmp23);
                                auto tmp25 = at::vec::VecMask<int64_t,2>(tmp22 == tmp24);
                                auto tmp27 = static_cast<float>(127.0);
                                auto tmp28 = tmp26 / tmp27;
                                auto tmp29 = static_cast<float>(1e-08);
                                auto tmp30 = float(tmp28 + tmp29);
                                auto tmp31 = c10::bit_cast<int32_t>(tmp30);
                                auto tmp32 = at::vec::VecMask<int64_t,2>(tmp22 < tmp24);
                                auto tmp33 = [&]
                                {
                                    auto tmp34 = tmp32.template cast<float,1>().template loadu<int32_t,1>(out_ptr3 + static_cast<int64_t>(x1 + 16L*x0));
                                    auto tmp35 = in_ptr2[static_cast<int64_t>(0L)];
                                    auto tmp36 = static_cast<int64_t>(124);
                                    auto tmp37 = int64_t(tmp35 - tmp36);
                                    auto tmp38 = static_cast<int64_t>(4);
                                    auto tmp39 = max_propagate_nan(tmp37, tmp38);
                                    auto tmp40 = tmp39 < tmp38;
                                    auto tmp41 = int64_t(tmp39 - tmp38);
                                    auto tmp42 = static_cast<int64_t>(156);
                                    auto tmp43 = mod(tmp41, tmp42);
                                    auto tmp44 = tmp43 != tmp3;
                                    auto tmp45 = std::signbit(tmp43);
                                    auto tmp46 = std::signbit(tmp42);
                                    auto tmp47 = tmp45 != tmp46;
                                    auto tmp48 = tmp44 & tmp47;
                                    auto tmp49 = int64_t(tmp43 + tmp42);
                                    auto tmp50 = tmp48 ? tmp49 : tmp43;
                                    auto tmp51 = int64_t(tmp50 + tmp38);
                                    auto tmp52 = tmp40 ? tmp39 : tmp51;
                                    auto tmp53 = tmp52;
                                    auto tmp54 = c10::convert<int64_t>(tmp53);
                                    TORCH_CHECK(((0 <= tmp54) & (tmp54 < 160L)) | ~((tmp32).all_masked()), "index out of bounds: 0 <= tmp54 < 160L");
                                    auto tmp56 = tmp32.template cast<float,1>().template loadu<at::BFloat16,1>(in_ptr3 + static_cast<int64_t>(48L + x1 + 64L*tmp52 + 10240L*x0));
                                    auto tmp57 = at::vec::convert<float>(tmp56);
                                    auto tmp58 = at::vec::Vectorized<float>(tmp30);
                                    auto tmp59 = tmp57 / tmp58;
                                    auto tmp60 = tmp59.round();
                                    auto tmp61 = static_cast<float>(-127.0);
                                    auto tmp62 = at::vec::Vectorized<float>(tmp61);
                                    auto tmp63 = at::vec::maximum(tmp60, tmp62);
                                    auto tmp64 = at::vec::Vectorized<float>(tmp27);
                                    auto tmp65 = at::vec::minimum(tmp63, tmp64);
                                    auto tmp66 = at::vec::convert<int8_t>(tmp65);
                                    auto tmp67 = at::vec::convert<int32_t>(tmp66);
                                    auto tmp68 = static_cast<int32_t>(16777216);
                                    auto tmp69 = at::vec::Vectorized<int32_t>(tmp68);
                                    auto tmp70 = tmp67 * tmp69;
                                    auto tmp71 = tmp34 | tmp70;
                                    return tmp71;
                                }
                                ;
                                auto tmp74 =
                                [&]
                                {
                                    if (tmp32.all_zero())
                                    {
                                        return at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                    }
                                    else
                                    {
                                        auto tmp72 = tmp33();
                                        auto tmp73 = at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                        return decltype(tmp72)::blendv(tmp73, tmp72, tmp32.template cast<int32_t,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp75 = at::vec::Vectorized<int32_t>(tmp31);
                                auto tmp76 = decltype(tmp75)::blendv(tmp74, tmp75, tmp25.template cast<int32_t,1>());
                                auto tmp78 = tmp77 / tmp27;
                                auto tmp79 = float(tmp78 + tmp29);
                                auto tmp80 = c10::bit_cast<int32_t>(tmp79);
                                auto tmp81 = [&]
                                {
                                    auto tmp82 = tmp32.template cast<float,1>().template loadu<int32_t,1>(out_ptr5 + static_cast<int64_t>(x1 + 16L*x0));
                                    auto tmp83 = in_ptr2[static_cast<int64_t>(0L)];
                                    auto tmp84 = static_cast<int64_t>(124);
                                    auto tmp85 = int64_t(tmp83 - tmp84);
                                    auto tmp86 = static_cast<int64_t>(4);
                                    auto tmp87 = max_propagate_nan(tmp85, tmp86);
                                    auto tmp88 = tmp87 < tmp86;
                                    auto tmp89 = int64_t(tmp87 - tmp86);
                                    auto tmp90 = static_cast<int64_t>(156);
                                    auto tmp91 = mod(tmp89, tmp90);
                                    auto tmp92 = tmp91 != tmp3;
                                    auto tmp93 = std::signbit(tmp91);
                                    auto tmp94 = std::signbit(tmp90);
                                    auto tmp95 = tmp93 != tmp94;
                                    auto tmp96 = tmp92 & tmp95;
                                    auto tmp97 = int64_t(tmp91 + tmp90);
                                    auto tmp98 = tmp96 ? tmp97 : tmp91;
                                    auto tmp99 = int64_t(tmp98 + tmp86);
                                    auto tmp100 = tmp88 ? tmp87 : tmp99;
                                    auto tmp101 = tmp100;
                                    auto tmp102 = c10::convert<int64_t>(tmp101);
                                    TORCH_CHECK(((0 <= tmp102) & (tmp102 < 160L)) | ~((tmp32).all_masked()), "index out of bounds: 0 <= tmp102 < 160L");
                                    auto tmp104 = tmp32.template cast<float,1>().template loadu<at::BFloat16,1>(in_ptr4 + static_cast<int64_t>(48L + x1 + 64L*tmp100 + 10240L*x0));
                                    auto tmp105 = at::vec::convert<float>(tmp104);
                                    auto tmp106 = at::vec::Vectorized<float>(tmp79);
                                    auto tmp107 = tmp105 / tmp106;
                                    auto tmp108 = tmp107.round();
                                    auto tmp109 = static_cast<float>(-127.0);
                                    auto tmp110 = at::vec::Vectorized<float>(tmp109);
                                    auto tmp111 = at::vec::maximum(tmp108, tmp110);
                                    auto tmp112 = at::vec::Vectorized<float>(tmp27);
                                    auto tmp113 = at::vec::minimum(tmp111, tmp112);
                                    auto tmp114 = at::vec::convert<int8_t>(tmp113);
                                    auto tmp115 = at::vec::convert<int32_t>(tmp114);
                                    auto tmp116 = static_cast<int32_t>(16777216);
                                    auto tmp117 = at::vec::Vectorized<int32_t>(tmp116);
                                    auto tmp118 = tmp115 * tmp117;
                                    auto tmp119 = tmp82 | tmp118;
                                    return tmp119;
                                }
                                ;
                                auto tmp122 =
                                [&]
                                {
                                    if (tmp32.all_zero())
                                    {
                                        return at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                    }
                                    else
                                    {
                                        auto tmp120 = tmp81();
                                        auto tmp121 = at::vec::Vectorized<int32_t>(static_cast<int32_t>(0));
                                        return decltype(tmp120)::blendv(tmp121, tmp120, tmp32.template cast<int32_t,1>());
                                    }
                                }
                                ()
                                ;
                                auto tmp123 = at::vec::Vectorized<int32_t>(tmp80);
                                auto tmp124 = decltype(tmp123)::blendv(tmp122, tmp123, tmp25.template cast<int32_t,1>());
                                tmp76.store(out_ptr7 + static_cast<int64_t>(x1 + 17L*tmp16 + 71077L*x0), static_cast<int64_t>(1L));
                                tmp124.store(out_ptr8 + static_cast<int64_t>(x1 + 17L*tmp16 + 71077L*x0), static_cast<int64_t>(1L));
                            }
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x0 >= static_cast<int64_t>(0L) && x0 < static_cast<int64_t>(3L)))
                        {
                            for (int64_t x0_tail = static_cast<int64_t>(0L);x0_tail < static_cast<int64_t>(3L); x0_tail++)
                            {
                                auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                                auto tmp1 = static_cast<int64_t>(124);
                                auto tmp2 = int64_t(tmp0 - tmp1);
                                auto tmp3 = static_cast<int64_t>(4);
                                auto tmp4 = tmp2 >= tmp3;
                                auto tmp5 = max_propagate_nan(tmp2, tmp3);
                                auto tmp6 = tmp5 < tmp3;
                                auto tmp7 = int64_t(tmp5 - tmp3);
                                auto tmp8 = static_cast<int64_t>(156);
                                auto tmp9 = mod(tmp7, tmp8);
                                auto tmp10 = static_cast<int32_t>(0);
                                auto tmp11 = tmp9 != tmp10;
                                auto tmp12 = std::signbit(tmp9);
                                auto tmp13 = std::signbit(tmp8);
                                auto tmp14 = tmp12 != tmp13;
                                auto tmp15 = tmp11 & tmp14;
                                auto tmp16 = int64_t(tmp9 + tmp8);
                                auto tmp17 = tmp15 ? tmp16 : tmp9;
                                auto tmp18 = int64_t(tmp17 + tmp3);
                                auto tmp19 = tmp6 ? tmp5 : tmp18;
                                auto tmp20 = tmp19;
                                auto tmp21 = c10::convert<int64_t>(tmp20);
                                TORCH_CHECK((0 <= tmp21) & (tmp21 < 4341L), "index out of bounds: 0 <= tmp21 < 4341L");
                                auto tmp23 = in_ptr5[static_cast<int64_t>(tmp19 + 4341L*x0_tail)];
                                auto tmp24 = static_cast<int32_t>(-1);
                                auto tmp25 = tmp4 ? tmp23 : tmp24;
                                out_ptr9[static_cast<int64_t>(x0_tail)] = tmp25;
                                out_ptr10[static_cast<int64_t>(x0_tail)] = tmp23;
                            }
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
                {
                    {
                        {
                            auto tmp0 = out_ptr6[static_cast<int64_t>(x0)];
                            auto tmp22 = out_ptr9[static_cast<int64_t>(x0)];
                            auto tmp1 = static_cast<int32_t>(4181);
                            auto tmp2 = mod(tmp0, tmp1);
                            auto tmp3 = static_cast<int32_t>(0);
                            auto tmp4 = tmp2 != tmp3;
                            auto tmp5 = std::signbit(tmp2);
                            auto tmp6 = std::signbit(tmp1);
                            auto tmp7 = tmp5 != tmp6;
                            auto tmp8 = tmp4 & tmp7;
                            auto tmp9 = int32_t(tmp2 + tmp1);
                            auto tmp10 = tmp8 ? tmp9 : tmp2;
                            auto tmp11 = c10::convert<int64_t>(tmp10);
                            auto tmp12 = static_cast<int64_t>(160);
                            auto tmp13 = int64_t(tmp11 + tmp12);
                            auto tmp14 = 4341L;
                            auto tmp15 = c10::convert<int64_t>(tmp14);
                            auto tmp16 = int64_t(tmp13 + tmp15);
                            auto tmp17 = tmp13 < 0;
                            auto tmp18 = tmp17 ? tmp16 : tmp13;
                            auto tmp19 = tmp18;
                            auto tmp20 = c10::convert<int64_t>(tmp19);
                            TORCH_CHECK((0 <= tmp20) & (tmp20 < 4341L), "index out of bounds: 0 <= tmp20 < 4341L");
                            out_ptr11[static_cast<int64_t>(tmp18 + 4341L*x0)] = tmp22;
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x0 >= static_cast<int64_t>(0L) && x0 < static_cast<int64_t>(3L)))
                        {
                            for (int64_t x0_tail = static_cast<int64_t>(0L);x0_tail < static_cast<int64_t>(3L); x0_tail++)
                            {
                                auto tmp0 = in_ptr2[static_cast<int64_t>(0L)];
                                auto tmp28 = out_ptr10[static_cast<int64_t>(x0_tail)];
                                auto tmp1 = static_cast<int64_t>(124);
                                auto tmp2 = int64_t(tmp0 - tmp1);
                                auto tmp3 = static_cast<int64_t>(4);
                                auto tmp4 = max_propagate_nan(tmp2, tmp3);
                                auto tmp5 = tmp4 < tmp3;
                                auto tmp6 = int64_t(tmp4 - tmp3);
                                auto tmp7 = static_cast<int64_t>(156);
                                auto tmp8 = mod(tmp6, tmp7);
                                auto tmp9 = static_cast<int32_t>(0);
                                auto tmp10 = tmp8 != tmp9;
                                auto tmp11 = std::signbit(tmp8);
                                auto tmp12 = std::signbit(tmp7);
                                auto tmp13 = tmp11 != tmp12;
                                auto tmp14 = tmp10 & tmp13;
                                auto tmp15 = int64_t(tmp8 + tmp7);
                                auto tmp16 = tmp14 ? tmp15 : tmp8;
                                auto tmp17 = int64_t(tmp16 + tmp3);
                                auto tmp18 = tmp5 ? tmp4 : tmp17;
                                auto tmp19 = 4341L;
                                auto tmp20 = c10::convert<int64_t>(tmp19);
                                auto tmp21 = int64_t(tmp18 + tmp20);
                                auto tmp22 = tmp18 < 0;
                                auto tmp23 = tmp22 ? tmp21 : tmp18;
                                auto tmp24 = tmp23;
                                auto tmp25 = c10::convert<int64_t>(tmp24);
                                TORCH_CHECK((0 <= tmp25) & (tmp25 < 4341L), "index out of bounds: 0 <= tmp25 < 4341L");
                                auto tmp27 = tmp2 >= tmp3;
                                auto tmp29 = static_cast<int32_t>(-1);
                                auto tmp30 = tmp27 ? tmp29 : tmp28;
                                out_ptr11[static_cast<int64_t>(tmp23 + 4341L*x0_tail)] = tmp30;
                            }
                        }
                    }
                }
            }
        }
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
            {
                {
                    float tmp_acc0 = std::numeric_limits<float>::infinity();
                    at::vec::Vectorized<float> tmp_acc0_vec = at::vec::Vectorized<float>(std::numeric_limits<float>::infinity());
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4181L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(4176L)))
                            {
                                auto tmp0 = at::vec::Vectorized<int32_t>::loadu(out_ptr11 + static_cast<int64_t>(160L + x1 + 4341L*x0), static_cast<int64_t>(16));
                                auto tmp1 = static_cast<int32_t>(0);
                                auto tmp2 = at::vec::Vectorized<int32_t>(tmp1);
                                auto tmp3 = at::vec::VecMask<int32_t,1>(tmp0 >= tmp2);
                                auto tmp4 = at::vec::convert<float>(tmp0);
                                auto tmp5 = std::numeric_limits<float>::infinity();
                                auto tmp6 = at::vec::Vectorized<float>(tmp5);
                                auto tmp7 = decltype(tmp4)::blendv(tmp6, tmp4, tmp3.template cast<float,1>());
                                tmp_acc0_vec = at::vec::minimum(tmp_acc0_vec, tmp7);
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(4176L) && x1 < static_cast<int64_t>(4181L)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(4176L);x1_tail < static_cast<int64_t>(4181L); x1_tail++)
                                {
                                    auto tmp0 = out_ptr11[static_cast<int64_t>(160L + x1_tail + 4341L*x0)];
                                    auto tmp1 = static_cast<int32_t>(0);
                                    auto tmp2 = tmp0 >= tmp1;
                                    auto tmp3 = c10::convert<float>(tmp0);
                                    auto tmp4 = std::numeric_limits<float>::infinity();
                                    auto tmp5 = tmp2 ? tmp3 : tmp4;
                                    tmp_acc0 = min_propagate_nan(tmp_acc0, tmp5);
                                }
                            }
                        }
                    }
                    tmp_acc0 = min_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<float, 1>([](at::vec::Vectorized<float>& x, at::vec::Vectorized<float>& y) { return at::vec::minimum(x, y); }, tmp_acc0_vec));
                    out_ptr12[static_cast<int64_t>(x0)] = static_cast<float>(tmp_acc0);
                }
            }
        }
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
            {
                {
                    int32_t tmp_acc0 = std::numeric_limits<int32_t>::max();
                    at::vec::Vectorized<int32_t> tmp_acc0_vec = at::vec::Vectorized<int32_t>(std::numeric_limits<int32_t>::max());
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4181L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(4176L)))
                            {
                                auto tmp0 = at::vec::Vectorized<int32_t>::loadu(out_ptr11 + static_cast<int64_t>(160L + x1 + 4341L*x0), static_cast<int64_t>(16));
                                auto tmp8 = out_ptr12[static_cast<int64_t>(x0)];
                                auto tmp1 = static_cast<int32_t>(0);
                                auto tmp2 = at::vec::Vectorized<int32_t>(tmp1);
                                auto tmp3 = at::vec::VecMask<int32_t,1>(tmp0 >= tmp2);
                                auto tmp4 = at::vec::convert<float>(tmp0);
                                auto tmp5 = std::numeric_limits<float>::infinity();
                                auto tmp6 = at::vec::Vectorized<float>(tmp5);
                                auto tmp7 = decltype(tmp4)::blendv(tmp6, tmp4, tmp3.template cast<float,1>());
                                auto tmp9 = at::vec::Vectorized<float>(tmp8);
                                auto tmp10 = at::vec::VecMask<float,1>(tmp7 == tmp9);
                                auto tmp11 = static_cast<int32_t>(2147483647);
                                auto tmp12 = at::vec::Vectorized<int32_t>(tmp11);
                                auto tmp13 = decltype(tmp0)::blendv(tmp12, tmp0, tmp10.template cast<int32_t,1>());
                                tmp_acc0_vec = at::vec::minimum(tmp_acc0_vec, tmp13);
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(4176L) && x1 < static_cast<int64_t>(4181L)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(4176L);x1_tail < static_cast<int64_t>(4181L); x1_tail++)
                                {
                                    auto tmp0 = out_ptr11[static_cast<int64_t>(160L + x1_tail + 4341L*x0)];
                                    auto tmp6 = out_ptr12[static_cast<int64_t>(x0)];
                                    auto tmp1 = static_cast<int32_t>(0);
                                    auto tmp2 = tmp0 >= tmp1;
                                    auto tmp3 = c10::convert<float>(tmp0);
                                    auto tmp4 = std::numeric_limits<float>::infinity();
                                    auto tmp5 = tmp2 ? tmp3 : tmp4;
                                    auto tmp7 = tmp5 == tmp6;
                                    auto tmp8 = static_cast<int32_t>(2147483647);
                                    auto tmp9 = tmp7 ? tmp0 : tmp8;
                                    tmp_acc0 = min_propagate_nan(tmp_acc0, tmp9);
                                }
                            }
                        }
                    }
                    tmp_acc0 = min_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<int32_t, 1>([](at::vec::Vectorized<int32_t>& x, at::vec::Vectorized<int32_t>& y) { return at::vec::minimum(x, y); }, tmp_acc0_vec));
                    out_ptr13[static_cast<int64_t>(x0)] = static_cast<int32_t>(tmp_acc0);
                }
            }
        }
        {
            #pragma omp for
            for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
            {
                {
                    int32_t tmp_acc0 = std::numeric_limits<int32_t>::max();
                    at::vec::Vectorized<int32_t> tmp_acc0_vec = at::vec::Vectorized<int32_t>(std::numeric_limits<int32_t>::max());
                    int32_t tmp_acc1 = 0;
                    at::vec::Vectorized<int32_t> tmp_acc1_vec = at::vec::Vectorized<int32_t>(0);
                    for(int64_t x1=static_cast<int64_t>(0L); x1<static_cast<int64_t>(4181L); x1+=static_cast<int64_t>(16L))
                    {
                        {
                            if(C10_LIKELY(x1 >= static_cast<int64_t>(0) && x1 < static_cast<int64_t>(4176L)))
                            {
                                auto tmp0 = at::vec::Vectorized<int32_t>::loadu(out_ptr11 + static_cast<int64_t>(160L + x1 + 4341L*x0), static_cast<int64_t>(16));
                                auto tmp8 = out_ptr12[static_cast<int64_t>(x0)];
                                auto tmp14 = out_ptr13[static_cast<int64_t>(x0)];
                                auto tmp1 = static_cast<int32_t>(0);
                                auto tmp2 = at::vec::Vectorized<int32_t>(tmp1);
                                auto tmp3 = at::vec::VecMask<int32_t,1>(tmp0 >= tmp2);
                                auto tmp4 = at::vec::convert<float>(tmp0);
                                auto tmp5 = std::numeric_limits<float>::infinity();
                                auto tmp6 = at::vec::Vectorized<float>(tmp5);
                                auto tmp7 = decltype(tmp4)::blendv(tmp6, tmp4, tmp3.template cast<float,1>());
                                auto tmp9 = at::vec::Vectorized<float>(tmp8);
                                auto tmp10 = at::vec::VecMask<float,1>(tmp7 == tmp9);
                                auto tmp11 = static_cast<int32_t>(2147483647);
                                auto tmp12 = at::vec::Vectorized<int32_t>(tmp11);
                                auto tmp13 = decltype(tmp0)::blendv(tmp12, tmp0, tmp10.template cast<int32_t,1>());
                                auto tmp15 = at::vec::Vectorized<int32_t>(tmp14);
                                auto tmp16 = at::vec::VecMask<int32_t,1>(tmp13 == tmp15);
                                auto tmp17 = x1;
                                auto tmp18 = c10::convert<int32_t>(tmp17);
                                auto tmp19 = at::vec::Vectorized<int32_t>::arange(tmp18, 1);
                                auto tmp20 = static_cast<int32_t>(4181);
                                auto tmp21 = at::vec::Vectorized<int32_t>(tmp20);
                                auto tmp22 = decltype(tmp19)::blendv(tmp21, tmp19, tmp16.template cast<int32_t,1>());
                                auto tmp23 = tmp3.to<int32_t,1>();
                                tmp_acc0_vec = at::vec::minimum(tmp_acc0_vec, tmp22);
                                tmp_acc1_vec = tmp_acc1_vec + tmp23;
                            }
                            if(C10_UNLIKELY(x1 >= static_cast<int64_t>(4176L) && x1 < static_cast<int64_t>(4181L)))
                            {
                                for (int64_t x1_tail = static_cast<int64_t>(4176L);x1_tail < static_cast<int64_t>(4181L); x1_tail++)
                                {
                                    auto tmp0 = out_ptr11[static_cast<int64_t>(160L + x1_tail + 4341L*x0)];
                                    auto tmp6 = out_ptr12[static_cast<int64_t>(x0)];
                                    auto tmp10 = out_ptr13[static_cast<int64_t>(x0)];
                                    auto tmp1 = static_cast<int32_t>(0);
                                    auto tmp2 = tmp0 >= tmp1;
                                    auto tmp3 = c10::convert<float>(tmp0);
                                    auto tmp4 = std::numeric_limits<float>::infinity();
                                    auto tmp5 = tmp2 ? tmp3 : tmp4;
                                    auto tmp7 = tmp5 == tmp6;
                                    auto tmp8 = static_cast<int32_t>(2147483647);
                                    auto tmp9 = tmp7 ? tmp0 : tmp8;
                                    auto tmp11 = tmp9 == tmp10;
                                    auto tmp12 = x1_tail;
                                    auto tmp13 = c10::convert<int32_t>(tmp12);
                                    auto tmp14 = static_cast<int32_t>(4181);
                                    auto tmp15 = tmp11 ? tmp13 : tmp14;
                                    auto tmp16 = c10::convert<int32_t>(tmp2);
                                    tmp_acc0 = min_propagate_nan(tmp_acc0, tmp15);
                                    tmp_acc1 = tmp_acc1 + tmp16;
                                }
                            }
                        }
                    }
                    tmp_acc0 = min_propagate_nan(tmp_acc0, at::vec::vec_reduce_all<int32_t, 1>([](at::vec::Vectorized<int32_t>& x, at::vec::Vectorized<int32_t>& y) { return at::vec::minimum(x, y); }, tmp_acc0_vec));
                    out_ptr14[static_cast<int64_t>(x0)] = static_cast<int32_t>(tmp_acc0);
                    tmp_acc1 = tmp_acc1 + at::vec::vec_reduce_all<int32_t, 1>([](at::vec::Vectorized<int32_t>& x, at::vec::Vectorized<int32_t>& y) { return x + y; }, tmp_acc1_vec);
                    out_ptr15[static_cast<int64_t>(x0)] = static_cast<int32_t>(tmp_acc1);
                }
            }
        }
        #pragma omp single
        {
            {
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(16L))
                {
                    {
                        if(C10_LIKELY(x0 >= static_cast<int64_t>(0L) && x0 < static_cast<int64_t>(3L)))
                        {
                            for (int64_t x0_tail = static_cast<int64_t>(0L);x0_tail < static_cast<int64_t>(3L); x0_tail++)
                            {
                                auto tmp0 = out_ptr15[static_cast<int64_t>(x0_tail)];
                                auto tmp3 = out_ptr14[static_cast<int64_t>(x0_tail)];
                                auto tmp1 = static_cast<int32_t>(4180);
                                auto tmp2 = tmp0 > tmp1;
                                auto tmp4 = static_cast<int32_t>(4181);
                                auto tmp5 = mod(tmp3, tmp4);
                                auto tmp6 = static_cast<int32_t>(0);
                                auto tmp7 = tmp5 != tmp6;
                                auto tmp8 = std::signbit(tmp5);
                                auto tmp9 = std::signbit(tmp4);
                                auto tmp10 = tmp8 != tmp9;
                                auto tmp11 = tmp7 & tmp10;
                                auto tmp12 = int32_t(tmp5 + tmp4);
                                auto tmp13 = tmp11 ? tmp12 : tmp5;
                                auto tmp14 = c10::convert<int64_t>(tmp13);
                                auto tmp15 = static_cast<int64_t>(160);
                                auto tmp16 = int64_t(tmp14 + tmp15);
                                auto tmp17 = tmp16;
                                auto tmp18 = c10::convert<int64_t>(tmp17);
                                TORCH_CHECK((0 <= tmp18) & (tmp18 < 4341L), "index out of bounds: 0 <= tmp18 < 4341L");
                                auto tmp20 = out_ptr11[static_cast<int64_t>(tmp16 + 4341L*x0_tail)];
                                auto tmp21 = static_cast<int32_t>(-1);
                                auto tmp22 = tmp2 ? tmp21 : tmp20;
                                out_ptr16[static_cast<int64_t>(x0_tail)] = tmp22;
                            }
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                #pragma GCC ivdep
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(3L); x0+=static_cast<int64_t>(1L))
                {
                    {
                        {
                            auto tmp0 = out_ptr14[static_cast<int64_t>(x0)];
                            auto tmp22 = out_ptr16[static_cast<int64_t>(x0)];
                            auto tmp1 = static_cast<int32_t>(4181);
                            auto tmp2 = mod(tmp0, tmp1);
                            auto tmp3 = static_cast<int32_t>(0);
                            auto tmp4 = tmp2 != tmp3;
                            auto tmp5 = std::signbit(tmp2);
                            auto tmp6 = std::signbit(tmp1);
                            auto tmp7 = tmp5 != tmp6;
                            auto tmp8 = tmp4 & tmp7;
                            auto tmp9 = int32_t(tmp2 + tmp1);
                            auto tmp10 = tmp8 ? tmp9 : tmp2;
                            auto tmp11 = c10::convert<int64_t>(tmp10);
                            auto tmp12 = static_cast<int64_t>(160);
                            auto tmp13 = int64_t(tmp11 + tmp12);
                            auto tmp14 = 4341L;
                            auto tmp15 = c10::convert<int64_t>(tmp14);
                            auto tmp16 = int64_t(tmp13 + tmp15);
                            auto tmp17 = tmp13 < 0;
                            auto tmp18 = tmp17 ? tmp16 : tmp13;
                            auto tmp19 = tmp18;
                            auto tmp20 = c10::convert<int64_t>(tmp19);
                            TORCH_CHECK((0 <= tmp20) & (tmp20 < 4341L), "index out of bounds: 0 <= tmp20 < 4341L");
                            out_ptr11[static_cast<int64_t>(tmp18 + 4341L*x0)] = tmp22;
                        }
                    }
                }
            }
        }
        #pragma omp single
        {
            {
                for(int64_t x0=static_cast<int64_t>(0L); x0<static_cast<int64_t>(576L); x0+=static_cast<int64_t>(32L))
                {
                    {
                        if(C10_LIKELY(x0 >= static_cast<int64_t>(0) && x0 < static_cast<int64_t>(576L)))
                        {
                            auto tmp0 = out_ptr1[static_cast<int64_t>(c10::div_floor_integer(static_cast<int64_t>(x0), static_cast<int64_t>(64L)))];
                            auto tmp1 = in_ptr6[static_cast<int64_t>(c10::div_floor_integer(static_cast<int64_t>(x0), static_cast<int64_t>(64L)))];
                            auto tmp4 = at::vec::VectorizedN<float,2>::loadu(in_ptr7 + static_cast<int64_t>(x0), static_cast<int64_t>(32));
                            auto tmp13 = out_ptr1[static_cast<int64_t>(9L + (c10::div_floor_integer(static_cast<int64_t>(x0), static_cast<int64_t>(64L))))];
                            auto tmp14 = at::vec::VectorizedN<float,2>::loadu(in_ptr8 + static_cast<int64_t>(x0), static_cast<int64_t>(32));
                            auto tmp2 = static_cast<float>(0.0);
                            auto tmp3 = tmp1 > tmp2;
                            auto tmp5 = at::vec::VectorizedN<float,2>(tmp1);
                            auto tmp6 = tmp4 / tmp5;
                            auto tmp7 = at::vec::VecMask<float,2>::from(tmp3);
                            auto tmp8 = at::vec::VectorizedN<float,2>(tmp2);
                            auto tmp9 = decltype(tmp6)::blendv(tmp8, tmp6, tmp7.template cast<float,2>());
                            auto tmp10 = at::vec::VectorizedN<float,2>(tmp0);
                            auto tmp11 = tmp10 * tmp9;
                            auto tmp12 = tmp11 + tmp8;
                            auto tmp15 = at::vec::VectorizedN<float,2>(tmp13);
                            auto tmp16 = tmp15 * tmp14;
                            auto tmp17 = tmp12 + tmp16;
                            auto tmp18 = float(tmp0 + tmp13);
                            auto tmp19 = at::vec::VectorizedN<float,2>(tmp18);
                            auto tmp20 = tmp17 / tmp19;
                            auto tmp21 = at::vec::convert<at::BFloat16,1,float,2>(tmp20);
                            tmp21.store(out_ptr17 + static_cast<int64_t>(x0), static_cast<int64_t>(32));
                        }
                    }
                }
            }
        }
    }
    inductor_cpu_integer_div_error_flag = nullptr;
    inductor_cpu_throw_if_integer_div_error(inductor_cpu_integer_div_error);
}
''')


