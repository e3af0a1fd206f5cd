// Data + expert parallel training of the language model (LmTrainer with dist::MpiLmParallel),
// run under mpirun with 1-4 ranks: every rank also trains the same model in one process (the
// reference) and compares step by step. The contract (docs/distributed.md, "Training"):
// - at one rank, the same bits as one process (losses, gradient norm, biases, parameters);
// - at more, the losses and the gradient norm equal one process's to fp32 rounding (the
//   gradients of what every rank holds whole are summed over the ranks in rank order), every
//   rank holds the same bits of everything it holds whole, and the balancer's bias (from exact
//   integer counts) is the same bits on every rank and — for these short runs — one process's;
// - the owners' experts, gathered to rank 0, equal one process's experts to fp32 rounding.
// Families: DeepSeek-V3 (shared experts, selection bias, loss-free sign), Qwen2-MoE (gated shared
// expert, the Switch aux loss over the whole batch, z-loss), GPT-OSS (expert biases, which every
// rank holds whole; seq-wise aux loss), Mixtral with micro-batches and SGD; placements
// contiguous, scattered and with ranks that own no expert.
#include "moekit/lm_train.hpp"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "moekit/dist.hpp"
#include "moekit/moekit.hpp"
#include "world.hpp"

namespace moekit {
namespace {

using testing::same_bytes_on_every_rank;
using testing::world_rank;
using testing::world_size;

std::vector<std::uint8_t> text_of(std::int64_t n, std::uint64_t seed) {
  // Text with some structure (a repeating phrase with noise), so that routing is not uniform.
  const std::string phrase = "the experts of a mixture route tokens; ";
  std::vector<std::uint8_t> t(static_cast<std::size_t>(n));
  std::uint64_t s = seed;
  for (std::int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    t[static_cast<std::size_t>(i)] =
        (s >> 60) == 0
            ? static_cast<std::uint8_t>((s >> 33) % 128)
            : static_cast<std::uint8_t>(phrase[static_cast<std::size_t>(i) % phrase.size()]);
  }
  return t;
}

struct Case {
  const char* name;
  const char* family;
  BalanceMode balance;
  std::int64_t micro_batches = 1;
  double z = 0;
  Optimizer::Kind optimizer = Optimizer::Kind::adamw;
  std::int64_t experts = 8;
  int placement = 0;  // 0 contiguous, 1 scattered (e % ranks reversed), 2 all on the last rank
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

LmConfig config_of(const Case& c) {
  BlockShape s;
  s.hidden_size = 16;
  s.num_experts = c.experts;
  s.top_k = 2;
  s.expert_width = 8;
  s.num_layers = 2;
  s.selection_bias = true;
  LmConfig lm;
  lm.block = parse_hf_config(preset_config_json(c.family, s));
  lm.vocab = 128;
  lm.context = 3;
  return lm;
}

LmTrainOptions options_of(const Case& c) {
  LmTrainOptions o;
  o.steps = 5;
  o.batch_tokens = 8 * 40;  // 8 sequences of 40: more than 256 rows per block call at one rank
  o.seq_len = 40;
  o.micro_batches = c.micro_batches;
  o.lr = LrSchedule{3e-3, 1, 5, LrSchedule::Decay::cosine, 3e-4};
  o.optimizer = c.optimizer;
  o.balance = c.balance;
  o.bias_rate.rate = 1e-2;
  o.aux_coef = 1e-2;
  o.z_coef = c.z;
  o.eval_every = 2;
  o.eval_tokens =
      9 * 40;  // 9 held-out sequences: a chunk of 8, then one of 1 that leaves ranks idle
  o.seed = 5;
  return o;
}

dist::ExpertPlacement placement_of(const Case& c, int P) {
  if (c.placement == 0) return dist::ExpertPlacement::contiguous(c.experts, P);
  std::vector<int> owner(static_cast<std::size_t>(c.experts));
  for (std::int64_t e = 0; e < c.experts; ++e)
    owner[static_cast<std::size_t>(e)] = c.placement == 1 ? P - 1 - static_cast<int>(e % P) : P - 1;
  return dist::ExpertPlacement::from_owners(owner, P);
}

double rel(double a, double b) { return std::fabs(a - b) / std::max(1e-30, std::fabs(b)); }

double max_rel_diff(const Tensor& a, const Tensor& b) {
  double err = 0, mx = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a.data_as<const float>()[i]) -
                                  b.data_as<const float>()[i]));
    mx = std::max(mx, std::fabs(static_cast<double>(b.data_as<const float>()[i])));
  }
  return err / std::max(mx, 1e-30);
}

class DistLmTrain : public ::testing::TestWithParam<Case> {};

TEST_P(DistLmTrain, MatchesOneProcessStepByStep) {
  const Case& c = GetParam();
  const int P = world_size(), rank = world_rank();
  const LmConfig config = config_of(c);
  const LmTrainOptions options = options_of(c);
  const auto train = text_of(6000, 1), held_out = text_of(1200, 2);
  LmTrainer ref(config, options, train, held_out);
  auto parallel = std::make_shared<dist::MpiLmParallel>(placement_of(c, P), MPI_COMM_WORLD);
  LmTrainer tr(config, options, train, held_out, parallel);
  EXPECT_EQ(tr.local_experts(), parallel->placement().experts_of(rank));
  // (At one rank the parallel run is the single-process run bit for bit; at more, to rounding.)
  const double tol = P == 1 ? 0.0 : 2e-5;
  bool moved = false;
  while (!tr.done()) {
    const StepResult a = tr.step(), b = ref.step();
    SCOPED_TRACE("step " + std::to_string(a.step));
    EXPECT_LE(rel(a.train_loss, b.train_loss), tol) << a.train_loss << " vs " << b.train_loss;
    EXPECT_LE(rel(a.grad_norm, b.grad_norm), tol * 10) << a.grad_norm << " vs " << b.grad_norm;
    EXPECT_LE(std::fabs(a.aux_loss - b.aux_loss),
              tol * std::max(1e-12, std::fabs(b.aux_loss)) + (P == 1 ? 0 : 1e-12));
    EXPECT_LE(std::fabs(a.z_loss - b.z_loss),
              tol * std::max(1e-12, std::fabs(b.z_loss)) + (P == 1 ? 0 : 1e-12));
    ASSERT_EQ(a.evaluated, b.evaluated);
    if (a.evaluated) {
      EXPECT_EQ(a.eval.tokens, b.eval.tokens);
      EXPECT_LE(rel(a.eval.loss, b.eval.loss), tol) << a.eval.loss << " vs " << b.eval.loss;
    }
    // The counts are exact: the load metrics and the bias equal one process's (for this short run
    // the tiny parameter differences move no token to another expert).
    ASSERT_EQ(a.layers.size(), b.layers.size());
    for (std::size_t l = 0; l < a.layers.size(); ++l) {
      EXPECT_EQ(a.layers[l].load.max_violation, b.layers[l].load.max_violation) << "layer " << l;
      EXPECT_EQ(a.layers[l].bias, b.layers[l].bias) << "layer " << l;
    }
    for (const Tensor& bias : tr.selection_biases()) {
      EXPECT_TRUE(same_bytes_on_every_rank(bias.data(), bias.nbytes()))
          << "the ranks hold different biases";
      moved = moved || (c.balance == BalanceMode::loss_free_sign && bias.numel() > 0 &&
                        bias.data_as<const float>()[0] != 0.0f);
    }
  }
  if (c.balance == BalanceMode::loss_free_sign) {
    EXPECT_TRUE(moved) << "the bias never moved: nothing was checked";
  }
  // What every rank holds whole is the same bits on every rank.
  const LmParams& mine = tr.params();
  for (const auto& [name, t] : mine.named()) {
    const bool routed = name.find("experts.gate") != std::string::npos ||
                        name.find("experts.up") != std::string::npos ||
                        name.find("experts.down") != std::string::npos;
    const bool bias = name.find("_bias") != std::string::npos;
    if (!routed || bias) {
      EXPECT_TRUE(same_bytes_on_every_rank(t.data(), t.nbytes())) << name << " differs over the ranks";
    }
  }
  // The experts gathered to rank 0 and the optimizer state equal one process's.
  const LmParams whole = tr.whole_params();
  const Optimizer opt = tr.whole_optimizer(whole);
  if (rank == 0) {
    const NamedTensors w = whole.named(), r = ref.params().named();
    ASSERT_EQ(w.size(), r.size());
    for (std::size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(w[i].first, r[i].first);
      ASSERT_EQ(w[i].second.shape(), r[i].second.shape()) << w[i].first;
      EXPECT_LE(max_rel_diff(w[i].second, r[i].second), P == 1 ? 0.0 : 1e-4) << w[i].first;
    }
    const NamedTensors so = opt.state(), sr = ref.optimizer().state();
    ASSERT_EQ(so.size(), sr.size());
    for (std::size_t i = 0; i < so.size(); ++i) {
      ASSERT_EQ(so[i].first, sr[i].first);
      ASSERT_EQ(so[i].second.shape(), sr[i].second.shape()) << so[i].first;
      if (P == 1) {
        EXPECT_EQ(std::memcmp(so[i].second.data(), sr[i].second.data(), so[i].second.nbytes()), 0)
            << so[i].first;
      } else {
        EXPECT_LE(max_rel_diff(so[i].second, sr[i].second), 1e-2) << so[i].first;
      }
    }
  } else {
    EXPECT_TRUE(whole.blocks.empty());
  }
}

// A checkpoint of the parallel run (gathered to rank 0, given whole to every rank) resumes it:
// the next steps are the uninterrupted run's bits.
void resume_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const int P = world_size(), rank = world_rank();
  const LmConfig config = config_of(c);
  const LmTrainOptions options = options_of(c);
  const auto train = text_of(6000, 1), held_out = text_of(1200, 2);
  const auto make = [&] {
    return std::make_unique<LmTrainer>(
        config, options, train, held_out,
        std::make_shared<dist::MpiLmParallel>(placement_of(c, P), MPI_COMM_WORLD));
  };
  auto straight = make(), first = make();
  for (int i = 0; i < 2; ++i) {
    straight->step();
    first->step();
  }
  LmParams whole = first->whole_params();
  Optimizer opt = first->whole_optimizer(whole);
  // Rank 0's whole state to every rank (as every rank reads the checkpoint's files).
  if (rank != 0) {
    whole = init_lm_parameters(config, 99);
  }
  for (auto& [name, t] : whole.named())
    MPI_Bcast(t.data(), static_cast<int>(t.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  NamedTensors state;
  std::int64_t steps = opt.steps();
  MPI_Bcast(&steps, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  for (const auto& [name, t] : whole.named()) {
    for (const char* prefix : {"m.", "v."}) {
      Tensor s(t.shape(), DType::f32);
      if (rank == 0)
        for (const auto& [n, v] : opt.state())
          if (n == prefix + name) s = v.clone();
      MPI_Bcast(s.data(), static_cast<int>(s.numel()), MPI_FLOAT, 0, MPI_COMM_WORLD);
      state.emplace_back(prefix + name, s);
    }
  }
  Optimizer given = Optimizer::adamw(options.adamw);
  given.load_state(state, steps, whole.named());
  auto second = make();
  second->restore(whole, first->selection_biases(), given, first->steps_done(), first->rng_state());
  while (!straight->done()) {
    const StepResult a = straight->step(), b = second->step();
    EXPECT_EQ(a.train_loss, b.train_loss) << "step " << a.step;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << a.step;
  }
  const NamedTensors want = straight->params().named(), got = second->params().named();
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const Tensor& a = want[i].second;
    const Tensor& b = got[i].second;
    ASSERT_EQ(a.nbytes(), b.nbytes()) << want[i].first;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << want[i].first;
  }
}

std::vector<Case> cases();

// Two of the cases (shared experts; micro-batches with every expert on the last rank): the
// resume path is the same code for every family.
TEST(DistLmTrain, ResumesFromItsGatheredCheckpointBitForBit) {
  resume_case(cases()[0]);
  resume_case(cases()[3]);
}

std::vector<Case> cases() {
  return {
      {"deepseek_v3_loss_free", "deepseek_v3", BalanceMode::loss_free_sign},
      {"qwen2_moe_switch_aux_z", "qwen2_moe", BalanceMode::aux, 1, 1e-3},
      {"gpt_oss_biases_seq_aux_scattered", "gpt_oss", BalanceMode::seq_aux, 1, 0.0,
       Optimizer::Kind::adamw, 8, 1},
      {"mixtral_micro_batches_none_on_last_rank", "mixtral", BalanceMode::loss_free_proportional, 2,
       0.0, Optimizer::Kind::adamw, 6, 2},
  };
}

INSTANTIATE_TEST_SUITE_P(Families, DistLmTrain, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

TEST(DistLmTrainErrors, TooFewSequencesPerRankFailEveryRank) {
  const int P = world_size();
  if (P < 2) GTEST_SKIP() << "one rank always has a sequence";
  Case c{"x", "deepseek_v3", BalanceMode::loss_free_sign};
  LmTrainOptions o = options_of(c);
  o.batch_tokens = 40;  // one sequence for P ranks
  try {
    LmTrainer tr(config_of(c), o, text_of(6000, 1), text_of(1200, 2),
                 std::make_shared<dist::MpiLmParallel>(placement_of(c, P), MPI_COMM_WORLD));
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("cannot be shared by"), std::string::npos) << e.what();
  }
}

TEST(DistLmTrainErrors, APlacementForAnotherRankCountFailsEveryRank) {
  const int P = world_size();
  EXPECT_THROW(dist::MpiLmParallel(dist::ExpertPlacement::contiguous(8, P + 1), MPI_COMM_WORLD),
               dist::RankError);
}

}  // namespace
}  // namespace moekit
