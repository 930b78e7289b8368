// CPU glue of int8_linear: argument checks, the few-rows kernel or dequantized blocks and ATen's GEMM, the kernels of
// the best ISA level (int8_linear_kernel.cpp), registration.
#include <ATen/cpu/Utils.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "../int8_linear.h"
#include "isa.h"
#include "widened_mm.h"

namespace pytransformer::cpu {
KernelTable<Int8GemvCpuFn> int8_gemv_kernel;
KernelTable<Int8DequantizeCpuFn> int8_dequantize_kernel;
KernelTable<Int8GemmCpuFn> int8_gemm_kernel;
KernelTable<Int8AmxCpuFn> int8_amx_kernel;

namespace {
// Whether the processor has AMX int8 tiles (as at::cpu reports them), the AVX-512 kernels may use extensions
// (avx512_extension_usable) and Linux lets this process use the tile data (at::cpu::init_amx asks, once).
bool amx_int8_available() {
  static const bool yes = [] {
    const auto caps = at::cpu::get_cpu_capabilities();
    const auto it = caps.find("amx_int8");
    return it != caps.end() && it->second.toBool() && avx512_extension_usable(true) && int8_amx_kernel.get() &&
           at::cpu::init_amx();
  }();
  return yes;
}
std::atomic<bool> amx_int8_on{true};  // int8_amx(false) turns the AMX path off (A/B measurements)
}  // namespace

bool int8_amx(std::optional<bool> enable) {
  if (enable) amx_int8_on = *enable;
  return amx_int8_on && amx_int8_available();
}

namespace {
// Up to this many rows of x, the row-by-row kernel (memory-bound: it reads the int8 weight once); more rows (prefill)
// are compute-bound and go by path_of.
constexpr int64_t kMaxGemvRows = 16;
// With AVX-512 VNNI, more than kMaxGemvRows rows go through the row-by-row kernel too, this many rows a call: VNNI does
// 32 or 64 products an instruction, where a float32 GEMM does 16 after widening every weight to float32, so it is
// several times faster at every row count (benchmarks/results/cpu_kernel_notes_2026-11-28.md, int8_linear.cpp). It also
// keeps a row's result the same whatever the number of rows.
constexpr int64_t kIntDotRowBlock = 8;

// How a call is computed:
// - kRows: the row-by-row kernel (gemv.h), in calls of kIntDotRowBlock rows where it quantizes x itself;
// - kGemm: with AVX2 as the best level, more than kMaxGemvRows rows: the GEMM of outer products (gemm.h) on the weight
//   widened to float32 as it is packed, x as it is (x_bits 8: rounded by the glue). On an AVX2 EPYC (Zen 3) it took
//   0.62-0.95x the time of AVX2's integer dot products (vpmaddwd, 8 rows a call) from 24 to 1024 rows of a 124M Llama's
//   layers, with the weights read from memory (at 16 rows, one call of the row-by-row kernel, 0.82-1.09x:
//   benchmarks/results/cpu_kernel_notes_2026-12-02_zen3_int8_gemm.md);
// - kAmx: with AMX int8 tiles (int8_amx), more than kMaxGemvRows rows and K from 1 to kAmxMaxK: x quantized per row
//   as the row-by-row kernel does it, products summed in integers by tiles of 16 rows by 16 outputs (the same
//   outputs; an AMX instruction does 16384 products where VNNI does 64);
// - kWidened: otherwise, more than kMaxGemvRows rows: dequantized weight blocks and ATen's GEMM (widened_mm.h).
enum class Path { kRows, kGemm, kAmx, kWidened };

Path path_of(at::ScalarType acc, int64_t rows, int64_t in_features) {
  if (rows <= kMaxGemvRows) return Path::kRows;
  if (acc != at::kFloat) return Path::kWidened;
  if (in_features >= 1 && in_features <= kAmxMaxK && int8_amx(std::nullopt)) return Path::kAmx;
  return best_isa() == kAvx2 ? Path::kGemm : has_int_dot_products() ? Path::kRows : Path::kWidened;
}
}  // namespace

bool int8_sums_in_integers(int64_t rows, int64_t in_features) {
  const Path path = path_of(at::kFloat, rows, in_features);
  return path == Path::kAmx || (has_int_dot_products() && path == Path::kRows);
}

namespace {
// x as the kernels take it: [M, K] in acc, and the bits to which the row-by-row kernel quantizes each row itself.
struct KernelX {
  at::Tensor x;
  int64_t quant_bits;  // 16 or 8; 0: none
};

// The one place where x_bits takes effect on the CPU. Where the row-by-row kernel sums in integers
// (int8_sums_in_integers) it quantizes x to x_bits itself (16 bits too, see int8_linear_kernel.cpp); elsewhere x_bits 8
// rounds x here to the values that quantization gives (round_x_to_8_bits) and x_bits 16 leaves x as it is.
KernelX x_for_kernels(const at::Tensor& x, const Int8LinearParams& p, at::ScalarType acc, int64_t x_bits) {
  const at::Tensor xa = x.reshape({p.rows, p.in_features}).to(acc).contiguous();
  if (acc == at::kFloat && int8_sums_in_integers(p.rows, p.in_features)) return {xa, x_bits};
  return {x_bits == 8 ? round_x_to_8_bits(xa) : xa, 0};
}

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                           const std::optional<at::Tensor>& bias, int64_t x_bits) {
  const Int8LinearParams p = check_int8_linear_args(x, weight, scale, bias, x_bits);
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const Path path = path_of(acc, p.rows, p.in_features);
  const KernelX kx = x_for_kernels(x, p, acc, x_bits);
  const at::Tensor& xa = kx.x;                                                     // [M, K]
  const at::Tensor w = weight.contiguous();                                       // [N, K]
  const at::Tensor s = scale.to(acc).contiguous();                                 // [N]
  const std::optional<at::Tensor> b = bias ? std::optional(bias->to(acc).contiguous()) : std::nullopt;
  at::Tensor out;  // [M, N] in acc
  if (path == Path::kWidened) {
    out = widened_mm(xa, p.out_features, b, [&](int64_t n0, int64_t nb, at::Tensor& d) {
      int8_dequantize_kernel.get()(acc, nb, p.in_features, w.const_data_ptr<int8_t>() + n0 * p.in_features,
                                   s.narrow(0, n0, nb).const_data_ptr(), d.mutable_data_ptr());
    });
  } else {
    out = at::empty({p.rows, p.out_features}, xa.options());
    if (path == Path::kAmx) {
      if (out.numel() > 0)
        int8_amx_kernel.get()(p, xa.const_data_ptr<float>(), w.const_data_ptr<int8_t>(), s.const_data_ptr<float>(),
                              b ? b->const_data_ptr<float>() : nullptr, out.mutable_data_ptr<float>(), kx.quant_bits);
    } else if (path == Path::kGemm) {
      if (out.numel() > 0)
        int8_gemm_kernel.get()(p, xa.const_data_ptr<float>(), w.const_data_ptr<int8_t>(), s.const_data_ptr<float>(),
                               b ? b->const_data_ptr<float>() : nullptr, out.mutable_data_ptr<float>());
    } else {
      const int64_t block = p.rows <= kMaxGemvRows ? p.rows : kIntDotRowBlock;
      const auto* xp = static_cast<const char*>(xa.const_data_ptr());
      auto* op = static_cast<char*>(out.mutable_data_ptr());
      for_row_blocks(p.rows, block, [&](int64_t m0, int64_t mb) {  // rows [m0, m0 + mb) of x and out
        int8_gemv_kernel.get()({mb, p.out_features, p.in_features}, acc, xp + m0 * p.in_features * xa.element_size(),
                               w.const_data_ptr<int8_t>(), s.const_data_ptr(), b ? b->const_data_ptr() : nullptr,
                               op + m0 * p.out_features * out.element_size(), kx.quant_bits);
      });
    }
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  return out.to(x.scalar_type()).view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("int8_linear", &int8_linear_cpu); }

}  // namespace pytransformer::cpu
