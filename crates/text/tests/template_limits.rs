//! A checkpoint's chat template is code from the internet: the releases' templates render the
//! probe conversation well within the limits, and hostile ones end in an error naming the limit
//! they hit — never a hang, a stack overflow or gigabytes of memory.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::kimi_tokenizer;
use k3_text::Dialect;
use k3_text::chat_format::{ChatFormat, Message, Role, TEMPLATE_LIMITS, TemplateLimits};

fn release(name: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat/templates").join(name))
        .unwrap()
}

#[test]
fn the_releases_templates_pass_the_probe_with_a_hundredth_of_the_limits() {
    let small = TemplateLimits {
        fuel: TEMPLATE_LIMITS.fuel / 100,
        depth: TEMPLATE_LIMITS.depth / 4,
        output: TEMPLATE_LIMITS.output / 100,
    };
    for name in ["Kimi-K2-Instruct.jinja", "Kimi-K2-Thinking.jinja", "moonshotai-Kimi-K2.jinja"] {
        let tok = kimi_tokenizer().with_chat_template(Some(release(name)));
        ChatFormat::with_limits(&tok, Dialect::Template, small).check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

/// The error rendering `source` gives, within `within`.
fn hostile(source: &str) -> String {
    let tok = kimi_tokenizer().with_chat_template(Some(source.to_string()));
    let t = Instant::now();
    let err = ChatFormat::new(&tok, Dialect::Template).check().expect_err(source).to_string();
    assert!(t.elapsed() < Duration::from_secs(60), "{source}: took {:?}", t.elapsed());
    // The same from a request's rendering, not only the probe's.
    let f = ChatFormat::new(&tok, Dialect::Template);
    assert!(f.prompt(&[Message::new(Role::User, "hi")], false).is_err(), "{source}");
    err
}

#[test]
fn a_template_that_never_ends_runs_out_of_fuel() {
    let e = hostile("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    assert!(e.contains("instructions"), "{e}");
}

#[test]
fn a_template_that_recurses_stops_at_the_depth() {
    let e = hostile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    assert!(e.contains("deeper than"), "{e}");
}

#[test]
fn a_template_that_writes_without_end_stops_at_the_size() {
    let e = hostile("{{ 'a' * 10**8 }}");
    assert!(e.contains("wrote more than"), "{e}");
    let e = hostile("{% for i in range(100000) %}{{ 'abcdefghij' * 1000 }}{% endfor %}");
    assert!(e.contains("wrote more than"), "{e}");
}

#[test]
fn a_list_cannot_be_made_to_hold_itself() {
    let e = hostile("{% set ns = namespace(l=[]) %}{% set _ = ns.l.append(ns.l) %}{{ ns.l }}");
    assert!(e.contains("appended to itself"), "{e}");
    let e = hostile(
        "{% set ns = namespace(a=[], b=[]) %}{% set _ = ns.a.append(ns.b) %}{% set _ = ns.b.append([ns.a]) %}{{ ns.a }}",
    );
    assert!(e.contains("appended to itself"), "{e}");
}

#[test]
fn a_namespace_cannot_be_made_to_hold_itself() {
    for source in [
        "{% set ns = namespace(a=1) %}{% set ns.a = ns %}{{ ns }}",
        "{%- set ns = namespace(a=1) -%}{%- set alias = ns -%}{%- set ns.a = [alias] -%}{{ ns }}",
        "{% set ns = namespace(a=1) %}{% set other = namespace(b=1) %}{% set other.b = {'k': ns} %}{{ other }}",
    ] {
        let e = hostile(source);
        assert!(e.contains("a cycle"), "{source}: {e}");
    }
}
