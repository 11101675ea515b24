//! Which products round their activations, and the rule that picks it for a model.
//!
//! The rule (issue #57): rounded activations are a model's default where, on the trained
//! models, they add at most a tenth of the KL the model's own weight encodings cost against the
//! unquantized model, and never more than 1e-3 nats. Rounding is then lost in what the
//! encoding already costs; a model as trained (bf16 throughout) costs nothing, so it runs exact.
//! `tools/quality/activation-rule.sh` measures every encoding pair (docs/EFFICIENCY.md, "The
//! quality rule"); `crates/generate/tests/default_model.rs` holds each choice below to it.

use k3_format::{Encoding, Model};
use k3_quant::Matrix;

/// Where the engine multiplies rounded activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// The rule's choice for the model loaded ([`ActivationPrecision::for_model`]); what
    /// generate, chat and serve run.
    Auto,
    /// f32 everywhere: the engine's default, and what every comparison with a reference runs.
    #[default]
    Exact,
    /// The routed experts only, on int8: nearly all of a MoE prefill's arithmetic, and on the
    /// default model a mean KL of 4e-5 nats against exact (the trunk's attention and dense MLPs
    /// cost 7x more KL for a small share of the work).
    Experts,
    /// The experts as [`Experts`](Self::Experts) (those without an int8 kernel, bf16 ones, on
    /// bf16), and the trunk's products of a batch (prefill chunks, drafts scored) on bf16: rounding
    /// each value to 8 significant bits costs far less than int8 blocks. A decode step's lone
    /// vector stays exact in the trunk.
    Bf16Trunk,
    /// Every integer-encoded matrix, trunk included, on int8.
    All,
}

/// How a model's routed experts are encoded, as far as the rule tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertWeights {
    /// bf16 or f32: the model as trained.
    Unquantized,
    Mxfp4,
    /// int4 in groups (k3's round-to-nearest, or an INT4 checkpoint's).
    Int4,
    /// WASTE's residual VQ.
    Vq,
    /// Anything the rule was not measured on (FP8, int2, a mix): runs exact.
    Unmeasured,
}

/// How a model's trunk matrices are encoded (its tables and vectors aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrunkWeights {
    Unquantized,
    /// int8 rows.
    Int8,
    /// int4 groups (with int8 rows where a row does not split into groups).
    Int4,
    /// FP8 or anything else the rule was not measured on: runs exact.
    Unmeasured,
}

/// What the rule reads of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeightClasses {
    pub experts: ExpertWeights,
    pub trunk: TrunkWeights,
}

impl WeightClasses {
    pub fn of(model: &Model) -> Self {
        let m = model.manifest();
        let mut experts = m.expert_layouts.iter().flat_map(|l| &l.matrices).map(|t| match t.encoding {
            Encoding::F32 | Encoding::Bf16 => ExpertWeights::Unquantized,
            Encoding::Mxfp4 => ExpertWeights::Mxfp4,
            Encoding::Int4Group { .. } => ExpertWeights::Int4,
            Encoding::Vq { .. } => ExpertWeights::Vq,
            _ => ExpertWeights::Unmeasured,
        });
        let first = experts.next().unwrap_or(ExpertWeights::Unquantized);
        let experts = if experts.all(|e| e == first) { first } else { ExpertWeights::Unmeasured };
        let mut trunk = TrunkWeights::Unquantized;
        for t in &m.trunk.tensors {
            trunk = match (trunk, &t.tensor.encoding) {
                (_, Encoding::F32 | Encoding::Bf16 | Encoding::F16 | Encoding::U8) => trunk,
                (TrunkWeights::Unmeasured, _) => trunk,
                (_, Encoding::Int4Group { .. }) => TrunkWeights::Int4,
                (TrunkWeights::Int4, Encoding::Int8Row) => trunk,
                (_, Encoding::Int8Row) => TrunkWeights::Int8,
                _ => TrunkWeights::Unmeasured,
            };
        }
        WeightClasses { experts, trunk }
    }
}

impl ActivationPrecision {
    /// The rule's choice for weights of these classes: the most rounding precision that adds at
    /// most a tenth of the KL the weights cost (measured on the default model, mean KL over its
    /// 24,861 held-out positions; docs/EFFICIENCY.md "The quality rule"):
    /// - an int4 trunk (its weights cost 6.0e-3 to 6.9e-3 nats whatever the experts): int8
    ///   everywhere adds 3.2e-4 to 3.6e-4, a 20th or less;
    /// - MXFP4 or VQ experts on a bf16 or int8 trunk (1.0e-3 to 1.6e-3): int8 experts (VQ has no
    ///   int8 kernel) and bf16 trunk batches add 5.3% to 8.5% of it; int8 in the trunk would add
    ///   a fifth or more;
    /// - int4 experts on a bf16 or int8 trunk (4.9e-4, 6.8e-4: k3's int4 costs less than MXFP4):
    ///   int8 experts add 7.4%, 5.1%; bf16 trunk batches would add 15% to 22%;
    /// - bf16 experts on a bf16 or int8 trunk (nothing, 3.2e-4), and what was not measured: exact.
    pub fn for_weights(w: WeightClasses) -> Self {
        use ExpertWeights as E;
        use TrunkWeights as T;
        match (w.experts, w.trunk) {
            (E::Unmeasured, _) | (_, T::Unmeasured) => ActivationPrecision::Exact,
            (_, T::Int4) => ActivationPrecision::All,
            (E::Mxfp4 | E::Vq, T::Unquantized | T::Int8) => ActivationPrecision::Bf16Trunk,
            (E::Int4, T::Unquantized | T::Int8) => ActivationPrecision::Experts,
            (E::Unquantized, T::Unquantized | T::Int8) => ActivationPrecision::Exact,
        }
    }

    /// The MLA cache picked beside this (resolved) precision: int8 rows wherever it rounds
    /// products, f32 where it runs exact or the CPU has no AVX2 (the integer products' scalar
    /// reference is slower than f32). An int8 cache attended in integers adds 1.1e-5 to 1.3e-5
    /// nats on the trained default model (`perplexity --kv-cache int8 --mla-form absorbed
    /// --against`, windows 256 and 4,096; docs/EFFICIENCY.md, with kl64's), a 37th or less of
    /// the least the rounded classes' weights cost (4.9e-4), and brings K3's decode attention at
    /// 64k positions from 0.545 to 0.239 s a token (8 cores, `bench attn`).
    pub fn kv_cache(self) -> k3_attn::KvCacheType {
        let integers = k3_quant::cpu::level() != k3_quant::cpu::Level::Scalar;
        match self {
            ActivationPrecision::Auto | ActivationPrecision::Exact => k3_attn::KvCacheType::F32,
            _ if !integers => k3_attn::KvCacheType::F32,
            _ => k3_attn::KvCacheType::Int8,
        }
    }

    /// This precision for `model`: [`Auto`](Self::Auto) becomes the rule's choice, the others
    /// stay as asked.
    pub fn for_model(self, model: &Model) -> Self {
        match self {
            ActivationPrecision::Auto => Self::for_weights(WeightClasses::of(model)),
            other => other,
        }
    }

    /// The precision of the routed experts' products ([`Auto`](Self::Auto) unresolved: exact).
    pub fn experts(self) -> k3_quant::Activations {
        match self {
            ActivationPrecision::Auto | ActivationPrecision::Exact => k3_quant::Activations::Exact,
            _ => k3_quant::Activations::Int8,
        }
    }

    /// An expert matrix at this precision: int8 where its encoding has an int8 kernel, and under
    /// [`Bf16Trunk`](Self::Bf16Trunk) bf16 batches where it has none.
    pub(crate) fn for_experts(self, m: Matrix<'_>) -> Matrix<'_> {
        let m = m.with_activations(self.experts());
        if self == ActivationPrecision::Bf16Trunk && !m.takes_q8() {
            m.with_activations(k3_quant::Activations::Bf16)
        } else {
            m
        }
    }

    /// The precision of the trunk's products.
    pub fn trunk(self) -> k3_quant::Activations {
        match self {
            ActivationPrecision::All => k3_quant::Activations::Int8,
            ActivationPrecision::Bf16Trunk => k3_quant::Activations::Bf16,
            ActivationPrecision::Auto | ActivationPrecision::Exact | ActivationPrecision::Experts => {
                k3_quant::Activations::Exact
            }
        }
    }

    /// The precision of the output head's product (the logits): as the trunk's, except under
    /// [`Bf16Trunk`](Self::Bf16Trunk), whose logits stay exact.
    pub fn head(self) -> k3_quant::Activations {
        match self {
            ActivationPrecision::Bf16Trunk => k3_quant::Activations::Exact,
            other => other.trunk(),
        }
    }

    /// What each class of products runs at on this CPU under this precision: a rounding the
    /// CPU has no kernel for runs exact (int8 needs AVX2 or better, bf16 AVX512-BF16).
    pub fn ran(self) -> Ran {
        let (int8, bf16) = (k3_quant::q8::available(), k3_quant::bf16dot::available_at(k3_quant::cpu::level()));
        let on_this_cpu = |a: k3_quant::Activations| match a {
            k3_quant::Activations::Int8 if int8 => "int8",
            k3_quant::Activations::Bf16 if bf16 => "bf16 batches",
            _ => "exact",
        };
        // Under bf16-trunk, experts without an int8 kernel (bf16 ones) take bf16 batches.
        let experts = if self == ActivationPrecision::Bf16Trunk && int8 && bf16 {
            "int8 (bf16 batches where bf16)"
        } else {
            on_this_cpu(self.experts())
        };
        Ran {
            experts,
            trunk: on_this_cpu(self.trunk()),
            head: on_this_cpu(self.head()),
            simd: k3_quant::cpu::level().name(),
        }
    }

    /// Every precision, in the order `--activations` lists them.
    pub const ALL: [Self; 5] = [
        ActivationPrecision::Auto,
        ActivationPrecision::Exact,
        ActivationPrecision::Experts,
        ActivationPrecision::Bf16Trunk,
        ActivationPrecision::All,
    ];

    /// The names `--activations` takes.
    pub const NAMES: [&str; 5] =
        [Self::ALL[0].name(), Self::ALL[1].name(), Self::ALL[2].name(), Self::ALL[3].name(), Self::ALL[4].name()];

    pub const fn name(self) -> &'static str {
        match self {
            ActivationPrecision::Auto => "auto",
            ActivationPrecision::Exact => "exact",
            ActivationPrecision::Experts => "int8-experts",
            ActivationPrecision::Bf16Trunk => "bf16-trunk",
            ActivationPrecision::All => "int8",
        }
    }
}

/// What the products of each class of matrices ran at ([`ActivationPrecision::ran`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Ran {
    pub experts: &'static str,
    pub trunk: &'static str,
    pub head: &'static str,
    /// The kernels' instruction set level on this CPU.
    pub simd: &'static str,
}

impl std::str::FromStr for ActivationPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("`{s}` is not an activation precision (one of {})", Self::NAMES.join(", ")))
    }
}
