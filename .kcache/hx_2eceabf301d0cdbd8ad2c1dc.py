# hloexec fused kernel (generated; helpers 73de07174141)
from numba import njit
from hloexec.kernels.scalar import (np, math, fmax_nan, fmin_nan, fclamp_nan, fsign, round_afz, sdiv, srem, udiv, urem, ipow, total_order_key32, total_order_key64, popcount, count_leading_zeros, f16_to_f32, f32_to_f16, bf16_to_f32, f32_to_bf16, f64_to_f16, round_f16, round_bf16, bitcast_f32_to_i32, bitcast_f32_to_u32, bitcast_i32_to_f32, bitcast_u32_to_f32, bitcast_f64_to_i64, bitcast_f64_to_u64, bitcast_i64_to_f64, bitcast_u64_to_f64, exp_wide, expm1_wide, log_wide, log1p_wide, tanh_wide, logistic_wide, narrow_to_f16, narrow_to_bf16)


@njit(cache=True, error_model='numpy', nogil=True)
def kernel(o0, p0, p1):
    lanes3 = np.empty(16, np.float32)
    for i0 in range(8):
        for i1 in range(64):
            r1 = np.float32(0.0)
            lanes3[:] = np.float32(0)
            v8 = p0[np.uint64(i0), np.uint64(i1), 0]
            for jb4 in range(8):
                for ju5 in range(16):
                    x6 = (jb4 * 16 + ju5)
                    v7 = p1[np.uint64(i0), np.uint64(i1), np.uint64(x6)]
                    v9 = np.float32(v7 - v8)
                    v10 = np.float32(v9 * v9)
                    lanes3[ju5] = np.float32(lanes3[ju5] + v10)
            r1 = np.float32(r1 + np.float32(np.float32(np.float32(np.float32(lanes3[0] + lanes3[1]) + np.float32(lanes3[2] + lanes3[3])) + np.float32(np.float32(lanes3[4] + lanes3[5]) + np.float32(lanes3[6] + lanes3[7]))) + np.float32(np.float32(np.float32(lanes3[8] + lanes3[9]) + np.float32(lanes3[10] + lanes3[11])) + np.float32(np.float32(lanes3[12] + lanes3[13]) + np.float32(lanes3[14] + lanes3[15])))))
            v11 = r1
            o0[np.uint64(i0), np.uint64(i1)] = v11
