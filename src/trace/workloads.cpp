// The built-in workloads. Shapes follow what the programs allocate; the
// random parts (sequence lengths, request lengths, tensor sizes and
// lifetimes) come from a splitmix64 generator with integer-only arithmetic,
// so every platform produces the same trace.
#include "tidepool/workloads.hpp"

#include <algorithm>
#include <bit>
#include <queue>
#include <string>

#include "tidepool/units.hpp"

namespace tidepool::trace {
namespace {

class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
  }
  /// Uniform in [low, high]; the modulo bias is immaterial for these ranges.
  std::uint64_t between(std::uint64_t low, std::uint64_t high) { return low + next() % (high - low + 1); }
  /// Roughly log-uniform in [low, high): a uniform power-of-two octave, then uniform within it.
  /// Precondition: 1 <= low < high.
  std::uint64_t log_uniform(std::uint64_t low, std::uint64_t high) {
    const int low_octave = std::bit_width(low) - 1;
    const int high_octave = std::bit_width(high - 1) - 1;
    const auto octave = static_cast<int>(between(static_cast<std::uint64_t>(low_octave),
                                                 static_cast<std::uint64_t>(high_octave)));
    const std::uint64_t from = std::max(low, std::uint64_t{1} << octave);
    const std::uint64_t to = std::min(high - 1, (std::uint64_t{1} << octave << 1) - 1);
    return between(from, to);
  }
  /// True with probability percent / 100.
  bool chance(std::uint64_t percent) { return next() % 100 < percent; }

 private:
  std::uint64_t state_;
};

// Appends events; blocks are numbered in alloc order as the model requires.
class Builder {
 public:
  explicit Builder(std::string_view name) {
    trace_.name = std::string{name};
    trace_.format = "builtin";
    trace_.device_capacity = 80 * GiB;
  }
  std::uint32_t alloc(std::uint64_t bytes, Stream stream = kDefaultStream) {
    Event event;
    event.op = Op::alloc;
    event.block = trace_.num_blocks++;
    event.bytes = bytes;
    event.stream = stream;
    trace_.events.push_back(event);
    bytes_.push_back(bytes);
    streams_.push_back(stream);
    return event.block;
  }
  void free(std::uint32_t block) {
    Event event;
    event.op = Op::free;
    event.block = block;
    event.bytes = bytes_[block];
    event.stream = streams_[block];
    trace_.events.push_back(event);
  }
  /// Frees `block` on `stream`, not the stream it was allocated on (work on
  /// another stream used it last, as with PyTorch's record_stream).
  void free_on(std::uint32_t block, Stream stream) {
    free(block);
    trace_.events.back().stream = stream;
  }
  void free_all(const std::vector<std::uint32_t>& blocks) {
    for (std::uint32_t block : blocks) free(block);
  }
  Trace take() { return std::move(trace_); }

 private:
  Trace trace_;
  std::vector<std::uint64_t> bytes_;
  std::vector<Stream> streams_;
};

// --- train-step: a GPT-style transformer, mixed precision, AdamW ----------
//
// 16 layers, width 2048, vocabulary 50304 (about 0.9 B parameters): fp32
// weights, gradients and two Adam moments (about 14.5 GB) stay long-lived
// or are re-created each step; bf16 activations (about 0.5 GiB a layer at
// 8192 tokens) are saved layer by layer in the forward pass and freed in
// reverse in the backward pass. Each step draws its sequence length
// (1024 to 2048 in steps of 64), as with variable-length batches.
Trace train_step(const WorkloadOptions& options) {
  constexpr std::uint64_t layers = 16, width = 2048, vocab = 50304, heads = 16, batch = 4;
  constexpr std::uint64_t fp32 = 4, bf16 = 2;
  const std::uint32_t steps = options.steps;
  Random random(options.seed);
  Builder b("train-step");

  // Parameter shapes (elements), embedding first, then each layer's.
  std::vector<std::uint64_t> params{vocab * width};
  for (std::uint64_t l = 0; l < layers; ++l) {
    for (std::uint64_t elements : {width, width, width * 3 * width, 3 * width, width * width, width, width,
                                   width, width * 4 * width, 4 * width, 4 * width * width, width}) {
      params.push_back(elements);
    }
  }
  params.push_back(width);  // final layer norm
  params.push_back(width);
  std::vector<std::uint32_t> weights;
  for (std::uint64_t elements : params) weights.push_back(b.alloc(elements * fp32));
  std::vector<std::uint32_t> adam_moments;  // created by the first optimizer step

  for (std::uint32_t step = 0; step < steps; ++step) {
    const std::uint64_t seq = 64 * random.between(16, 32);
    const std::uint64_t tokens = batch * seq;
    const std::uint32_t input_ids = b.alloc(tokens * 8);
    const std::uint32_t labels = b.alloc(tokens * 8);

    // Forward. Per layer: bf16 casts of its matrices (autocast; autograd keeps
    // them for the backward pass) and the activations it saves.
    std::vector<std::vector<std::uint32_t>> saved(layers);
    std::uint32_t residual = b.alloc(tokens * width * fp32);  // embedding output
    for (std::uint64_t l = 0; l < layers; ++l) {
      auto& keep = saved[l];
      for (std::uint64_t elements : {width * 3 * width, width * width, width * 4 * width, 4 * width * width}) {
        keep.push_back(b.alloc(elements * bf16));
      }
      keep.push_back(b.alloc(tokens * width * bf16));      // ln1 output
      keep.push_back(b.alloc(tokens * 3 * width * bf16));  // qkv
      keep.push_back(b.alloc(tokens * width * bf16));      // attention output
      keep.push_back(b.alloc(batch * heads * seq * fp32)); // softmax log-sum-exp
      const std::uint32_t workspace = b.alloc(32 * MiB);   // attention kernel workspace
      b.free(workspace);
      keep.push_back(b.alloc(tokens * width * bf16));      // projection output
      keep.push_back(residual);                            // residual stream, fp32
      residual = b.alloc(tokens * width * fp32);
      keep.push_back(b.alloc(tokens * width * bf16));      // ln2 output
      keep.push_back(b.alloc(tokens * 4 * width * bf16));  // fc1 output
      keep.push_back(b.alloc(tokens * 4 * width * bf16));  // gelu output
      const std::uint32_t fc2_out = b.alloc(tokens * width * bf16);
      keep.push_back(residual);
      residual = b.alloc(tokens * width * fp32);
      b.free(fc2_out);
    }
    const std::uint32_t final_norm = b.alloc(tokens * width * bf16);
    const std::uint32_t logits = b.alloc(tokens * vocab * bf16);
    const std::uint32_t logits_fp32 = b.alloc(tokens * vocab * fp32);  // upcast for the loss
    const std::uint32_t loss = b.alloc(fp32);

    // Backward: the loss gradient, then the layers in reverse, each freeing
    // what it saved as its gradients are produced.
    std::vector<std::uint32_t> grads(params.size(), 0);
    const std::uint32_t grad_logits = b.alloc(tokens * vocab * fp32);
    b.free(logits_fp32);
    b.free(loss);
    grads[0] = b.alloc(params[0] * fp32);  // tied embedding / output head
    std::uint32_t grad = b.alloc(tokens * width * bf16);
    b.free(grad_logits);
    b.free(logits);
    b.free(final_norm);
    b.free(residual);
    for (std::uint64_t l = layers; l-- > 0;) {
      const auto& keep = saved[l];
      const std::size_t first_param = 1 + l * 12;
      // Saved activations, last produced first; each gives an input gradient.
      for (std::size_t i = keep.size(); i-- > 4;) {
        const std::uint32_t grad_in = b.alloc(tokens * width * bf16);
        b.free(grad);
        grad = grad_in;
        b.free(keep[i]);
      }
      // The matrices' gradients: bf16 from the matmul, accumulated into fp32.
      for (std::size_t p = 0; p < 12; ++p) {
        const bool matrix = p == 2 || p == 4 || p == 8 || p == 10;
        if (matrix) {
          const std::uint32_t grad_bf16 = b.alloc(params[first_param + p] * bf16);
          grads[first_param + p] = b.alloc(params[first_param + p] * fp32);
          b.free(grad_bf16);
        } else {
          grads[first_param + p] = b.alloc(params[first_param + p] * fp32);
        }
      }
      for (std::size_t i = 4; i-- > 0;) b.free(keep[i]);  // the bf16 weight casts
    }
    grads[params.size() - 2] = b.alloc(params[params.size() - 2] * fp32);
    grads[params.size() - 1] = b.alloc(params[params.size() - 1] * fp32);
    b.free(grad);
    b.free(input_ids);
    b.free(labels);

    // AdamW (foreach): the moments on the first step, then list-wide temporaries.
    if (adam_moments.empty()) {
      for (std::uint64_t elements : params) adam_moments.push_back(b.alloc(elements * fp32));
      for (std::uint64_t elements : params) adam_moments.push_back(b.alloc(elements * fp32));
    }
    std::vector<std::uint32_t> denominators;
    for (std::uint64_t elements : params) denominators.push_back(b.alloc(elements * fp32));
    b.free_all(denominators);
    b.free_all(grads);  // zero_grad(set_to_none=True)
  }
  (void)weights;  // weights and moments stay live: the model's state
  return b.take();
}

// --- llm-inference: continuous batching with a paged KV cache -----------
//
// A 7B-class decoder (32 layers, width 4096, MLP 11008, vocabulary 32000,
// bf16 weights, about 13 GB). Requests with prompts of 128 to 2048 tokens
// and 32 to 1024 generated tokens are served at most 8 at a time; each
// keeps, per layer, KV blocks of 16 tokens (256 KiB) appended as its
// sequence grows and freed when it finishes. Prefill and decode steps
// allocate activations sized by prompt length and batch size.
Trace llm_inference(const WorkloadOptions& options) {
  constexpr std::uint64_t layers = 32, width = 4096, mlp = 11008, vocab = 32000, bf16 = 2, fp32 = 4;
  constexpr std::uint64_t block_tokens = 16, block_bytes = block_tokens * 2 * width * bf16;
  constexpr std::size_t max_batch = 8;
  const std::uint32_t requests = options.steps;
  Random random(options.seed);
  Builder b("llm-inference");

  b.alloc(vocab * width * bf16);  // embedding
  for (std::uint64_t l = 0; l < layers; ++l) {
    for (std::uint64_t elements : {width, width * width, width * width, width * width, width * width, width,
                                   width * mlp, width * mlp, mlp * width}) {
      b.alloc(elements * bf16);
    }
  }
  b.alloc(width * bf16);          // final norm
  b.alloc(vocab * width * bf16);  // output head

  struct Request {
    std::uint64_t prompt = 0, output = 0, tokens = 0, generated = 0;
    std::vector<std::uint32_t> blocks;  // layer-major per 16-token block
  };
  std::vector<Request> pending(requests);
  for (Request& r : pending) {
    r.prompt = random.between(128, 2048);
    r.output = random.between(32, 1024);
  }
  std::reverse(pending.begin(), pending.end());  // served first to last from the back
  std::vector<Request> active;

  auto grow = [&](Request& r) {  // a new block in every layer
    for (std::uint64_t l = 0; l < layers; ++l) r.blocks.push_back(b.alloc(block_bytes));
  };
  while (!pending.empty() || !active.empty()) {
    while (active.size() < max_batch && !pending.empty()) {
      Request r = std::move(pending.back());
      pending.pop_back();
      // Prefill: the whole prompt through every layer, one layer at a time.
      const std::uint32_t hidden = b.alloc(r.prompt * width * bf16);
      for (std::uint64_t l = 0; l < layers; ++l) {
        const std::uint32_t qkv = b.alloc(r.prompt * 3 * width * bf16);
        const std::uint32_t gate = b.alloc(r.prompt * mlp * bf16);
        const std::uint32_t up = b.alloc(r.prompt * mlp * bf16);
        b.free(qkv);
        b.free(gate);
        b.free(up);
      }
      for (r.tokens = 0; r.tokens < r.prompt; r.tokens += block_tokens) grow(r);
      r.tokens = r.prompt;
      const std::uint32_t logits = b.alloc(vocab * fp32);
      b.free(logits);
      b.free(hidden);
      active.push_back(std::move(r));
    }
    // One decode step for the batch.
    const std::uint64_t batch = active.size();
    const std::uint32_t hidden = b.alloc(batch * width * bf16);
    const std::uint32_t qkv = b.alloc(batch * 3 * width * bf16);
    const std::uint32_t mlp_out = b.alloc(batch * 2 * mlp * bf16);
    const std::uint32_t logits = b.alloc(batch * vocab * fp32);
    for (Request& r : active) {
      if (r.tokens % block_tokens == 0) grow(r);
      ++r.tokens;
      ++r.generated;
    }
    b.free(logits);
    b.free(mlp_out);
    b.free(qkv);
    b.free(hidden);
    for (std::size_t i = 0; i < active.size();) {
      if (active[i].generated < active[i].output) {
        ++i;
        continue;
      }
      b.free_all(active[i].blocks);
      active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  return b.take();  // the weights stay live
}

// --- small-tensors: many small allocations of varied sizes and lifetimes --
//
// Like an eager program of many small ops (optimizer bookkeeping, shapes,
// masks, embeddings lookups): sizes from 4 bytes to 32 MiB, most of them
// small; most tensors die within a few allocations, some live for
// thousands, a few for most of the run; 1 in 8 is on a second stream.
// `steps` thousands of tensors (default 100), all freed by the end.
Trace small_tensors(const WorkloadOptions& options) {
  const std::uint64_t count = std::uint64_t{options.steps} * 1000;
  Random random(options.seed);
  Builder b("small-tensors");
  using Due = std::pair<std::uint64_t, std::uint32_t>;  // (free at tensor number, block)
  std::priority_queue<Due, std::vector<Due>, std::greater<>> live;
  for (std::uint64_t t = 0; t < count; ++t) {
    while (!live.empty() && live.top().first <= t) {
      b.free(live.top().second);
      live.pop();
    }
    const std::uint64_t kind = random.between(0, 99);
    std::uint64_t bytes = kind < 40 ? random.between(1, 128) * 4                // scalars, shapes
                          : kind < 80 ? random.log_uniform(512, 256 * KiB)     // small tensors
                          : kind < 95 ? random.log_uniform(256 * KiB, 4 * MiB)
                                      : random.log_uniform(4 * MiB, 32 * MiB);
    bytes = round_up(bytes, 4);
    const Stream stream = random.between(0, 7) == 0 ? Stream{1} : kDefaultStream;
    const std::uint64_t lifetime = random.chance(60)   ? random.between(1, 8)
                                   : random.chance(75) ? random.between(64, 4096)
                                                       : random.between(16384, count);
    live.emplace(t + lifetime, b.alloc(bytes, stream));
  }
  std::vector<std::uint32_t> rest;
  while (!live.empty()) {
    rest.push_back(live.top().second);
    live.pop();
  }
  std::sort(rest.begin(), rest.end());
  b.free_all(rest);
  return b.take();
}

// --- multi-stream-inference: many streams, KV blocks of many sizes -------
//
// An inference server running 12 CUDA streams, one per worker, over shared
// bf16 weights (about 7 GB in 288 tensors, default stream). Each worker serves requests
// one after another; a request's KV cache grows by one block per 16 tokens,
// and the block size is the request's (its model variant and head layout:
// 128 KiB to 6 MiB), so the cache holds blocks of many sizes at once. Each
// decode step allocates activations sized by the worker's batch. A finished
// request's blocks are freed by the scheduler on the default stream half
// of the time (the block was last used there), else on the worker's stream.
// `steps` is the requests per worker (default 12).
Trace multi_stream_inference(const WorkloadOptions& options) {
  constexpr std::uint64_t workers = 12, width = 4096, bf16 = 2;
  constexpr std::uint64_t block_sizes[] = {128 * KiB, 384 * KiB, 1 * MiB, 1536 * KiB, 2 * MiB, 3 * MiB, 6 * MiB};
  const std::uint32_t requests = options.steps;
  Random random(options.seed);
  Builder b("multi-stream-inference");
  for (int i = 0; i < 32 * 9; ++i) b.alloc(random.between(8, 90) * MiB / 2);  // the weights

  struct Worker {
    Stream stream = 0;
    std::uint32_t served = 0;
    std::uint64_t block_bytes = 0, tokens = 0, output = 0;
    std::vector<std::uint32_t> blocks;
  };
  std::vector<Worker> pool(workers);
  for (std::uint64_t w = 0; w < workers; ++w) pool[w].stream = static_cast<Stream>(w + 1);
  auto start = [&](Worker& w) {
    w.block_bytes = block_sizes[random.between(0, std::size(block_sizes) - 1)];
    w.tokens = random.between(64, 1024);
    w.output = w.tokens + random.between(32, 512);
    const std::uint32_t prompt = b.alloc(w.tokens * width * bf16, w.stream);  // prefill activations
    for (std::uint64_t t = 0; t < w.tokens; t += 16) w.blocks.push_back(b.alloc(w.block_bytes, w.stream));
    b.free(prompt);
  };
  for (Worker& w : pool) start(w);
  std::size_t busy = workers;
  while (busy > 0) {
    for (Worker& w : pool) {
      if (w.served == requests) continue;
      const std::uint64_t batch = random.between(1, 16);
      const std::uint32_t hidden = b.alloc(batch * width * bf16 * 3, w.stream);
      const std::uint32_t logits = b.alloc(batch * 32000 * 4, w.stream);
      for (std::uint64_t n = 0; n < 8; ++n, ++w.tokens) {
        if (w.tokens % 16 == 0) w.blocks.push_back(b.alloc(w.block_bytes, w.stream));
      }
      b.free(logits);
      b.free(hidden);
      if (w.tokens < w.output) continue;
      const Stream freeing = random.chance(50) ? kDefaultStream : w.stream;
      for (std::uint32_t block : w.blocks) b.free_on(block, freeing);
      w.blocks.clear();
      if (++w.served == requests) {
        --busy;
      } else {
        start(w);
      }
    }
  }
  return b.take();  // the weights stay live
}

// --- near-capacity: a training run at 95-99% of the pool's limit ---------
//
// Sized for the default limit, 0.75 of an 80 GiB device (60 GiB): 36 GiB of
// long-lived state (weights, gradients and optimizer moments in 1 to 768
// MiB tensors), then steps whose activations (large blocks of 8 to 640 MiB
// whose sizes change with each step's sequence length) bring the live bytes
// to 95-99% of the limit, freed in reverse as in a backward pass, with
// gradient buckets and workspaces of varying size in between.
// `steps` is the training steps (default 12).
Trace near_capacity(const WorkloadOptions& options) {
  const std::uint32_t steps = options.steps;
  constexpr std::uint64_t limit = 60 * GiB;
  Random random(options.seed);
  Builder b("near-capacity");
  std::uint64_t state = 0;
  while (state < 36 * GiB) {
    const std::uint64_t bytes = random.log_uniform(1 * MiB, 768 * MiB);
    b.alloc(bytes);
    state += bytes;
  }
  for (std::uint32_t step = 0; step < steps; ++step) {
    const std::uint64_t target = limit / 100 * random.between(96, 99);
    const std::uint64_t seq = random.between(8, 16);  // activation sizes scale with it
    std::vector<std::uint32_t> saved;
    std::uint64_t live = state;
    for (;;) {
      const std::uint64_t bytes = random.between(1, 40) * seq * MiB;
      if (live + bytes > target) break;
      saved.push_back(b.alloc(bytes));
      live += bytes;
      if (random.chance(30)) b.free(b.alloc(random.between(1, 64) * MiB));  // a workspace
    }
    // Backward: saved activations in reverse, each replaced by a gradient
    // bucket of another size for a while.
    std::vector<std::uint32_t> buckets;
    for (std::size_t i = saved.size(); i-- > 0;) {
      b.free(saved[i]);
      if (random.chance(25)) buckets.push_back(b.alloc(random.between(16, 96) * MiB));
      if (buckets.size() > 4) {
        b.free(buckets.front());
        buckets.erase(buckets.begin());
      }
    }
    b.free_all(buckets);
  }
  return b.take();  // the state stays live
}

// --- random-mixed: sizes log-uniform from 256 B to 64 MiB ----------------
//
// A bounded live set (at most 512 blocks) under random allocs and frees:
// each operation frees a random live block or allocates a new one, with
// sizes log-uniform in [256 B, 64 MiB]. `steps` thousands of operations
// (default 1,000: a million).
Trace random_mixed(const WorkloadOptions& options) {
  const std::uint64_t operations = std::uint64_t{options.steps} * 1000;
  constexpr std::size_t max_live = 512;
  Random random(options.seed);
  Builder b("random-mixed");
  std::vector<std::uint32_t> live;
  for (std::uint64_t op = 0; op < operations; ++op) {
    const bool allocate = live.empty() || (live.size() < max_live && random.chance(50));
    if (allocate) {
      live.push_back(b.alloc(round_up(random.log_uniform(256, 64 * MiB), 4)));
    } else {
      const std::size_t i = random.between(0, live.size() - 1);
      b.free(live[i]);
      live[i] = live.back();
      live.pop_back();
    }
  }
  std::sort(live.begin(), live.end());
  b.free_all(live);
  return b.take();
}

/// A built-in workload: what workloads() lists, and the function that makes it.
struct Builtin {
  WorkloadInfo info;
  Trace (*make)(const WorkloadOptions&);  // options.steps already resolved (not 0)
};

const std::vector<Builtin>& builtins() {
  static const std::vector<Builtin> list{
      {{"train-step",
        "transformer training steps (0.9 B parameters, AdamW, mixed precision): long-lived "
        "weights and optimizer state, activations saved layer by layer and freed in reverse",
        3, "training steps"},
       train_step},
      {{"llm-inference",
        "7B-class LLM serving 32 requests, 8 at a time, with a KV cache of 16-token blocks "
        "that grows with each sequence",
        32, "requests"},
       llm_inference},
      {{"small-tensors", "100,000 tensors of 4 B to 32 MiB with short, medium and long lifetimes on two streams",
        100, "thousands of tensors"},
       small_tensors},
      {{"multi-stream-inference",
        "an inference server on 12 streams: KV-cache blocks of 128 KiB to 6 MiB by "
        "request, half of them freed on another stream than their alloc",
        12, "requests per worker"},
       multi_stream_inference},
      {{"near-capacity",
        "training steps whose large activations of changing sizes bring live bytes to 95-99% "
        "of the default limit (60 GiB of an 80 GiB device)",
        12, "training steps"},
       near_capacity},
      {{"random-mixed", "a million allocs and frees, sizes log-uniform from 256 B to 64 MiB, at most 512 live",
        1000, "thousands of operations"},
       random_mixed},
  };
  return list;
}

}  // namespace

const std::vector<WorkloadInfo>& workloads() {
  static const std::vector<WorkloadInfo> list = [] {
    std::vector<WorkloadInfo> infos;
    for (const Builtin& builtin : builtins()) infos.push_back(builtin.info);
    return infos;
  }();
  return list;
}

Expected<Trace> make_workload(std::string_view name, const WorkloadOptions& options) {
  const auto& list = builtins();
  const auto found = std::find_if(list.begin(), list.end(), [name](const Builtin& b) { return b.info.name == name; });
  if (found == list.end()) {
    std::string known;
    for (const Builtin& b : list) known += (known.empty() ? "" : ", ") + std::string{b.info.name};
    return Error(Errc::invalid_argument, "unknown workload '" + std::string{name} + "' (known: " + known + ")");
  }
  const WorkloadInfo& info = found->info;
  const std::uint32_t most = kMaxStepsFactor * info.default_steps;
  if (options.steps > most) {
    return Error(Errc::invalid_argument,
                 "workload '" + std::string{name} + "': steps " + std::to_string(options.steps) + " is more than " +
                     std::to_string(kMaxStepsFactor) + " times its default of " +
                     std::to_string(info.default_steps) + " " + std::string{info.steps_are} +
                     "; allowed: 1 to " + std::to_string(most) + " (0: the default)");
  }
  WorkloadOptions sized = options;
  if (sized.steps == 0) sized.steps = info.default_steps;
  return found->make(sized);
}

}  // namespace tidepool::trace
