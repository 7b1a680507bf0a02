//! The README's recipes: code blocks between `<!-- recipe:NAME:begin -->` and
//! `<!-- recipe:NAME:end -->`, which tests compare with the code they compile.

/// The repository's README.
const README: &str = include_str!("../../README.md");

/// The code of the README's recipe `name`: the one ```` ```rust ```` block between its
/// markers, without the fences, trimmed.
///
/// # Panics
///
/// When the README has no such markers or they do not hold one rust code block: the
/// calling test fails, naming the recipe.
pub fn recipe(name: &str) -> &'static str {
    README
        .split(&format!("<!-- recipe:{name}:begin -->"))
        .nth(1)
        .and_then(|rest| rest.split(&format!("<!-- recipe:{name}:end -->")).next())
        .and_then(|block| block.trim().strip_prefix("```rust"))
        .and_then(|code| code.strip_suffix("```"))
        .map(str::trim)
        .unwrap_or_else(|| {
            panic!("the README has no {name} recipe (one rust code block between its markers)")
        })
}
