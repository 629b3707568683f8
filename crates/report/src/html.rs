//! Pieces shared by report.html and the dashboard page: escaping and the stylesheet.
//! Both pages are self-contained (no external fonts, scripts or styles), so they open
//! from a file or a bare HTTP server with no network.

/// Escapes text for HTML element content and double-quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

pub(crate) const STYLE: &str = r#"
:root { color-scheme: light; }
body { font-family: system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       margin: 0 auto; padding: 1.5rem 1rem 4rem; max-width: 1060px; color: #222;
       background: #fafafa; line-height: 1.4; }
h1 { font-size: 1.6rem; margin: 0 0 0.3rem; }
h2 { font-size: 1.2rem; margin: 2rem 0 0.6rem; border-bottom: 1px solid #ddd;
     padding-bottom: 0.2rem; }
h3 { font-size: 1rem; margin: 0 0 0.4rem; }
p.note { color: #555; }
table { border-collapse: collapse; margin: 0.3rem 0 1rem; background: #fff;
        font-size: 0.9rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: left;
         vertical-align: top; }
th { background: #f0f0f0; font-weight: 600; }
td:first-child { white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #f8f8f8; }
.ok { color: #1a7f37; font-weight: 600; }
.failed { color: #c62828; font-weight: 600; }
.audit { padding: 0.6rem 1rem; border-radius: 6px; margin: 1rem 0; background: #fff;
         border: 1px solid #ddd; }
.audit-ok { border-color: #1a7f37; }
.audit-failed { border-color: #c62828; }
.audit h2 { border: none; margin: 0 0 0.3rem; padding: 0; }
.chart { background: #fff; border: 1px solid #ddd; border-radius: 6px; padding: 0.6rem;
         margin: 0 0 1.2rem; }
.chart svg { display: block; width: 100%; height: auto; }
ul.contents { columns: 2; padding-left: 1.2rem; }
.tables { display: flex; flex-wrap: wrap; gap: 0 2rem; }
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            escape(r#"<a href="x">&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;"
        );
        assert_eq!(escape("qps-30000"), "qps-30000");
    }
}
