// attnkit's compiled torch ops: built on first use by attnkit.kernels._native_ops,
// loaded with torch.ops.load_library. Only what a compiled graph runs per call is here;
// everything rare calls back into the Python ops of the same namespace.
//
// attnkit::sdpa_settled(q, k, v, is_causal, scale, gqa, flash) -> out
//   torch's SDPA on the CPU, then one read of its output: every value finite and no row
//   all zeros shows that the kernel gave the non-finite policy's answer (the argument is
//   in attnkit.backends.sdpa.run.kernel_followed_policy). Otherwise the Python op
//   attnkit::sdpa_settle decides from the same output, and recomputes where it must.
//   flash: torch's own choice for these inputs, asked when the graph was traced, is its
//   CPU flash kernel, which is then called directly (as compiled SDPA does), without
//   SDPA's choice per call. q (B, H, L, E), k (B, Hk, S, E), v (B, Hk, S, Ev);
//   out (B, H, L, Ev), row-major.

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

namespace {

// True when each of the R rows of C values (bit patterns of one float format) holds a
// value other than +-0 and no value is inf or NaN: the largest magnitude of a row is
// then nonzero and below the exponent field. A plain max loop, which compilers vectorize.
template <typename Bits>
bool rows_settled(const Bits* rows, int64_t R, int64_t C, Bits magnitude, Bits exponent) {
    for (int64_t r = 0; r < R; ++r) {
        const Bits* row = rows + r * C;
        Bits top = 0;
        for (int64_t c = 0; c < C; ++c) {
            const Bits u = static_cast<Bits>(row[c] & magnitude);
            top = u > top ? u : top;
        }
        if (top == 0 || top >= exponent) return false;
    }
    return true;
}

bool settled(const at::Tensor& out) {
    const int64_t C = out.size(-1);
    const int64_t n = out.numel();
    if (C == 0 || n == 0) return false;
    const void* data = out.const_data_ptr();
    switch (out.scalar_type()) {
        case at::kFloat:
            return rows_settled<uint32_t>(static_cast<const uint32_t*>(data), n / C, C,
                                          0x7fffffffu, 0x7f800000u);
        case at::kHalf:
            return rows_settled<uint16_t>(static_cast<const uint16_t*>(data), n / C, C,
                                          0x7fff, 0x7c00);
        case at::kBFloat16:
            return rows_settled<uint16_t>(static_cast<const uint16_t*>(data), n / C, C,
                                          0x7fff, 0x7f80);
        default:
            return false;  // float64: the Python op reads it
    }
}

at::Tensor sdpa_settled(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        bool is_causal, double scale, bool gqa, bool flash) {
    // (the choice was made for row-major inputs: SDPA's flash kernel wants unit last strides)
    flash = flash && q.stride(-1) == 1 && k.stride(-1) == 1 && v.stride(-1) == 1;
    // row-major, as the op's fake kernel says: a compiled graph asserts its strides
    at::Tensor out =
        (flash ? std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(
                     q, k, v, 0.0, is_causal, std::nullopt, scale))
               : at::scaled_dot_product_attention(q, k, v, std::nullopt, 0.0, is_causal, scale,
                                                  gqa))
            .contiguous();  // (B, H, L, Ev)
    if (settled(out)) return out;
    static auto settle =
        c10::Dispatcher::singleton()
            .findSchemaOrThrow("attnkit::sdpa_settle", "")
            .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, bool, double, bool)>();
    return settle.call(out, q, k, v, is_causal, scale, gqa);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(attnkit, m) {
    m.def("sdpa_settled(Tensor q, Tensor k, Tensor v, bool is_causal, float scale, "
          "bool gqa, bool flash) -> Tensor");
}

TORCH_LIBRARY_IMPL(attnkit, CPU, m) { m.impl("sdpa_settled", sdpa_settled); }
