// The one TORCH_LIBRARY(pytransformer, m): every op's schema, forward and backward, and the autograd of the ops that a
// decoding step calls (below). Kernels are registered per device next to them (csrc/cpu/*.cpp, csrc/cuda/*.cpp); fake
// kernels, and the autograd of attention and masked_softmax, live in pytransformer/ops.
// Also the pybind11 module `pytransformer._C`, which loads this library and reports how it was built.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "cpu/isa.h"
#include "cpu/stream_prefetch.h"
#include "int8_linear.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

TORCH_LIBRARY(pytransformer, m) {
  // Norms: out, then per-row statistics (float32, float64 for float64 x) of shape x.shape[:-1].
  m.def("layer_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor out, Tensor mean, Tensor rstd)");
  m.def("layer_norm_backward(Tensor grad_out, Tensor x, Tensor mean, Tensor rstd, Tensor? weight, bool has_bias)"
        " -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  m.def("rms_norm(Tensor x, Tensor? weight, float eps) -> (Tensor out, Tensor rstd)");
  m.def("rms_norm_backward(Tensor grad_out, Tensor x, Tensor rstd, Tensor? weight) -> (Tensor grad_x, Tensor grad_weight)");
  // masked_softmax: softmax(scale * scores + mask) over the last dim; backward: grad_scores from out alone.
  m.def("masked_softmax(Tensor scores, Tensor? mask, float scale, bool causal) -> Tensor");
  m.def("masked_softmax_backward(Tensor grad_out, Tensor out, float scale) -> Tensor");
  // Attention: out [B, Hq, Lq, Dv] and the row log-sum-exp lse [B, Hq, Lq] (float32, float64 for float64 q).
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, bool causal, int? window, Tensor? key_lengths,"
        " float scale) -> (Tensor out, Tensor lse)");
  m.def("attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, Tensor? mask,"
        " bool causal, int? window, Tensor? key_lengths, float scale) -> (Tensor grad_q, Tensor grad_k, Tensor grad_v)");
  // KV cache (inference): append writes the caches in place; decode_attention reads them in place -> [B, Hq, T, Dv].
  // max_position / max_length: optional bounds of positions / cache_lengths known on the host (no device read).
  m.def("kv_cache_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, Tensor positions,"
        " int? max_position=None) -> ()");
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cache_lengths, float scale, int? window,"
        " int? max_length=None) -> Tensor");
  // Linear layer: x [..., K] @ weight [N, K]^T + bias [N] -> [..., N] (F.linear); its backward is ATen's matmuls.
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  // Weight-only int8 linear (inference): (x [..., K] @ weight int8 [N, K]^T) * scale [N] + bias [N] -> [..., N].
  m.def("int8_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias, int x_bits) -> Tensor");
}

namespace {
// The typed handle of the op `name` whose schema has the C++ signature Sig (each autograd kernel below has its op's).
template <class Sig>
c10::TypedOperatorHandle<Sig> find_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// op(args...) below autograd: inside an autograd function's forward, or in place of the function where the call
// records no history (grad mode off, or no tensor argument requiring grad; torch::autograd::compute_requires_grad),
// which is what the function's apply returns then, without the graph node, context and saved data that apply builds
// at every call. Decoding calls linear, int8_linear and decode_attention per layer per token under no_grad, where that
// is about a fifth of a small call's time (benchmarks/results/cpu_kernel_notes_2026-11-28.md, registration.cpp). Returns
// what op.call returns (a tensor, or a tuple of them for the norms).
template <class Op, class... Args>
auto call_below_autograd(const Op& op, const Args&... args) {
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(args...);
}

// A cache stores values, not autograd history: appending new keys that require grad neither records a graph nor
// makes the cache require grad (decode_attention's autograd, which refuses a backward, is NoBackward below).
// As torch's in-place ops do, the write refuses a cache that is a leaf requiring grad (or a view of one) and bumps
// the caches' version counters, so that a backward through a graph that saved a cache before the write raises
// instead of using the overwritten values.
void kv_cache_append_autograd(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_new,
                              const at::Tensor& v_new, const at::Tensor& positions,
                              std::optional<int64_t> max_position) {
  torch::autograd::check_inplace(k_cache, k_cache.requires_grad());
  torch::autograd::check_inplace(v_cache, v_cache.requires_grad());
  static const auto op = find_op<decltype(kv_cache_append_autograd)>("pytransformer::kv_cache_append");
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    op.call(k_cache, v_cache, k_new, v_new, positions, max_position);
  }
  torch::autograd::increment_version(k_cache);
  torch::autograd::increment_version(v_cache);
}

// linear's backward is ATen's matmuls (grad_x = g @ W, grad_W = g^T x, grad_b = g summed over the rows). It is a C++
// autograd function rather than a Python one: a decoding step calls linear for every projection of every layer, and a
// Python autograd kernel costs several microseconds a call even under no_grad.
struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static const auto& op() {
    static const auto op = find_op<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>(
        "pytransformer::linear");
    return op;
  }

  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["has_bias"] = bias.has_value();
    return call_below_autograd(op(), x, weight, bias);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], g = grads[0].reshape({-1, weight.size(0)});  // [M, N]
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) grad_x = grads[0].matmul(weight);                          // [..., K]
    if (ctx->needs_input_grad(1)) grad_weight = g.t().mm(x.reshape({-1, weight.size(1)}));   // [N, K]
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) grad_bias = g.sum(0);  // [N]
    return {grad_x, grad_weight, grad_bias};
  }
};

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  if (!torch::autograd::compute_requires_grad(x, weight, bias))
    return call_below_autograd(LinearFunction::op(), x, weight, bias);
  return LinearFunction::apply(x, weight, bias);
}

// layer_norm's and rms_norm's backward is their backward op, from the input and the statistics the forward saved (the
// statistics are outputs without gradients). C++ autograd functions for linear's reason: a decoding step calls a norm
// twice per layer, and a Python autograd kernel makes a small call several times slower than F.layer_norm
// (cpu_kernel_notes_2026-11-28.md, registration.cpp).
using Tensor3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Tensor2 = std::tuple<at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;

OptionalTensor defined_or_none(const at::Tensor& t) { return t.defined() ? OptionalTensor(t) : std::nullopt; }

struct LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
  static const auto& op() {
    static const auto op = find_op<Tensor3(const at::Tensor&, const OptionalTensor&, const OptionalTensor&, double)>(
        "pytransformer::layer_norm");
    return op;
  }

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const OptionalTensor& weight, const OptionalTensor& bias, double eps) {
    auto [out, mean, rstd] = call_below_autograd(op(), x, weight, bias, eps);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), mean, rstd});
    ctx->saved_data["has_bias"] = bias.has_value();
    ctx->mark_non_differentiable({mean, rstd});
    return {out, mean, rstd};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = find_op<Tensor3(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const OptionalTensor&, bool)>("pytransformer::layer_norm_backward");
    const auto saved = ctx->get_saved_variables();  // x, weight, mean, rstd
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    auto [grad_x, grad_weight, grad_bias] = op.call(grads[0], saved[0], saved[2], saved[3],
                                                    defined_or_none(saved[1]), has_bias);
    return {grad_x, saved[1].defined() ? grad_weight : at::Tensor(), has_bias ? grad_bias : at::Tensor(),
            at::Tensor()};
  }
};

struct RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
  static const auto& op() {
    static const auto op =
        find_op<Tensor2(const at::Tensor&, const OptionalTensor&, double)>("pytransformer::rms_norm");
    return op;
  }

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const OptionalTensor& weight, double eps) {
    auto [out, rstd] = call_below_autograd(op(), x, weight, eps);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), rstd});
    ctx->mark_non_differentiable({rstd});
    return {out, rstd};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    static const auto op = find_op<Tensor2(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                           const OptionalTensor&)>("pytransformer::rms_norm_backward");
    const auto saved = ctx->get_saved_variables();  // x, weight, rstd
    auto [grad_x, grad_weight] = op.call(grads[0], saved[0], saved[2], defined_or_none(saved[1]));
    return {grad_x, saved[1].defined() ? grad_weight : at::Tensor(), at::Tensor()};
  }
};

Tensor3 layer_norm_autograd(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                            double eps) {
  if (!torch::autograd::compute_requires_grad(x, weight, bias))
    return call_below_autograd(LayerNormFunction::op(), x, weight, bias, eps);
  const auto out = LayerNormFunction::apply(x, weight, bias, eps);
  return {out[0], out[1], out[2]};
}

Tensor2 rms_norm_autograd(const at::Tensor& x, const OptionalTensor& weight, double eps) {
  if (!torch::autograd::compute_requires_grad(x, weight))
    return call_below_autograd(RmsNormFunction::op(), x, weight, eps);
  const auto out = RmsNormFunction::apply(x, weight, eps);
  return {out[0], out[1]};
}

// The inference ops int8_linear and decode_attention run on inputs that require grad, and a backward through them
// raises `message`. A C++ autograd function for the same reason as linear's: each is called per layer per token.
struct NoBackward : public torch::autograd::Function<NoBackward> {
  template <class Op, class... Args>
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const char* message, const Op& op,
                            const Args&... args) {
    ctx->saved_data["message"] = std::string(message);
    return call_below_autograd(op, args...);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list) {
    TORCH_CHECK(false, ctx->saved_data["message"].toStringRef());
  }
};

at::Tensor int8_linear_autograd(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                const std::optional<at::Tensor>& bias, int64_t x_bits) {
  static const auto op = find_op<decltype(int8_linear_autograd)>("pytransformer::int8_linear");
  if (!torch::autograd::compute_requires_grad(x, weight, scale, bias))
    return call_below_autograd(op, x, weight, scale, bias, x_bits);
  return NoBackward::apply("int8_linear is an inference op and has no backward: run quantized models under "
                           "torch.no_grad() or torch.inference_mode()", op, x, weight, scale, bias, x_bits);
}

at::Tensor decode_attention_autograd(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                     const at::Tensor& cache_lengths, double scale, std::optional<int64_t> window,
                                     std::optional<int64_t> max_length) {
  static const auto op = find_op<decltype(decode_attention_autograd)>("pytransformer::decode_attention");
  if (!torch::autograd::compute_requires_grad(q, k_cache, v_cache, cache_lengths))
    return call_below_autograd(op, q, k_cache, v_cache, cache_lengths, scale, window, max_length);
  return NoBackward::apply("decode_attention is an inference op and has no backward: call it under torch.no_grad() "
                           "or torch.inference_mode(), and use pytransformer.ops.attention where gradients are needed",
                           op, q, k_cache, v_cache, cache_lengths, scale, window, max_length);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, Autograd, m) {
  m.impl("layer_norm", &layer_norm_autograd);
  m.impl("rms_norm", &rms_norm_autograd);
  m.impl("kv_cache_append", &kv_cache_append_autograd);
  m.impl("linear", &linear_autograd);
  m.impl("int8_linear", &int8_linear_autograd);
  m.impl("decode_attention", &decode_attention_autograd);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "pytransformer kernels; ops are registered under torch.ops.pytransformer";
  m.def("with_cuda", [] {
#ifdef PT_WITH_CUDA
    return true;
#else
    return false;
#endif
  }, "Whether the CUDA kernels were compiled in.");
  m.def("cpu_isa", [] {
    static const char* names[] = {"default", "avx2", "avx512"};
    return std::string(names[pytransformer::cpu::best_isa()]);
  }, "The CPU instruction set level the CPU kernels run with.");
  m.def("cpu_bf16_dot_products", [] { return pytransformer::cpu::has_avx512_bf16(); },
        "Whether the AVX-512 kernels use AVX-512 BF16 dot products (bfloat16 linear layers).");
  m.def("cpu_int_dot_products", [](int64_t rows, int64_t in_features) {
    return pytransformer::cpu::int8_sums_in_integers(rows, in_features);
  }, pybind11::arg("rows") = 1, pybind11::arg("in_features") = 768,
        "Whether int8_linear on the CPU sums in integers on float x quantized per row (to 16 bits, or to x_bits 8) at "
        "this many rows of x and in_features: with AVX-512 VNNI at every row count, with AVX2 as the best level up to "
        "16 rows (more take a float32 GEMM on x as it is), with AMX int8 tiles (cpu_amx) at every row count.");
  m.def("cpu_amx", [](std::optional<bool> enable) { return pytransformer::cpu::int8_amx(enable); },
        pybind11::arg("enable") = pybind11::none(),
        "Whether int8_linear's products of more than 16 rows run on AMX int8 tiles (where the processor has them and "
        "Linux grants them); enable=False turns them off, True back on where available.");
  m.def("cpu_stream_prefetch", [](std::optional<std::string> mode) {
    namespace cpu = pytransformer::cpu;
    if (mode) cpu::set_stream_prefetch(*mode);
    pybind11::dict state;
    state["mode"] = cpu::stream_prefetch_mode();
    for (const auto& s : cpu::stream_prefetch_states()) {
      pybind11::dict width;
      width["trials"] = s.trials;
      width["choice"] = s.choice < 0 ? pybind11::object(pybind11::none())
                                     : pybind11::object(pybind11::str(s.choice ? "prefetch" : "none"));
      width["none_bytes_per_s"] = s.bytes_per_s[0];
      width["prefetch_bytes_per_s"] = s.bytes_per_s[1];
      state[pybind11::int_(s.weight_width)] = width;
    }
    return state;
  }, pybind11::arg("mode") = pybind11::none(),
        "Whether the few-rows linear kernels (1 or 2 rows of x) prefetch weights in software: mode \"auto\" (the "
        "default; setting it starts the trials over) times both ways on the first large calls of each weight width "
        "and keeps the faster, \"on\" and \"off\" force a way. Returns the mode and, per weight width in bytes, "
        "the trials timed, the choice (None while trying) and the weight bytes per second of each way's trials.");
  m.def("cpu_kernels", [] {
    std::map<std::string, std::vector<int>> levels;
    for (const auto& r : pytransformer::cpu::kernel_registrations()) levels[r.table].push_back(r.level);
    for (auto& [table, l] : levels) std::sort(l.begin(), l.end());
    return levels;
  }, "The CPU kernel tables and the ISA levels registered in each (0 baseline, 1 AVX2, 2 AVX-512).");
}
