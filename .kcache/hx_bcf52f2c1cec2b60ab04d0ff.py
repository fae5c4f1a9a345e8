# hloexec fused kernel (generated; helpers 73de07174141)
from numba import njit
from hloexec.kernels.scalar import (np, math, fmax_nan, fmin_nan, fclamp_nan, fsign, round_afz, sdiv, srem, udiv, urem, ipow, total_order_key32, total_order_key64, popcount, count_leading_zeros, f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16, f64_to_f16, round_f16, round_bf16, bitcast_f32_to_i32, bitcast_f32_to_u32, bitcast_i32_to_f32, bitcast_u32_to_f32, bitcast_f64_to_i64, bitcast_f64_to_u64, bitcast_i64_to_f64, bitcast_u64_to_f64, exp_wide, expm1_wide, log_wide, log1p_wide, tanh_wide, logistic_wide, narrow_to_f16, narrow_to_bf16)


@njit(cache=True, error_model='numpy', nogil=True)
def kernel(o0, p0, p1, p2, p3, p4):
    for i0 in range(8):
        for i1 in range(64):
            v2 = p0[np.uint64(i0), np.uint64(i1), 0]
            v4 = p2[np.uint64(i0), np.uint64(i1)]
            v5 = np.float32(v4 / np.float32(128.0))
            v6 = np.float32(v5 + np.float32(9.999999747378752e-06))
            v7 = np.float32(np.float32(1) / np.sqrt(v6))
            for i2 in range(128):
                v1 = p1[np.uint64(i0), np.uint64(i1), np.uint64(i2)]
                v3 = np.float32(v1 - v2)
                v8 = np.float32(v3 * v7)
                v9 = p3[np.uint64(i2)]
                v10 = np.float32(v8 * v9)
                v11 = p4[np.uint64(i2)]
                v12 = np.float32(v10 + v11)
                o0[np.uint64(i0), np.uint64(i1), np.uint64(i2)] = v12
