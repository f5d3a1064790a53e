//! A readable line diff for `sluice plugin test --expect`: unified format, three lines of
//! context, bounded in length.

/// Lines of unchanged context around each change.
const CONTEXT: usize = 3;
/// Most diff lines printed; the rest are counted.
const MAX_DIFF_LINES: usize = 400;
/// Above this many cells (changed lines expected × changed lines actual) the changed middle
/// is shown as one block instead of aligned line by line, to bound time and memory.
const MAX_ALIGN_CELLS: usize = 4_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Removed,
    Added,
}

/// `None` when `expected` and `actual` have the same lines; else a unified diff from
/// `expected` (`-`) to `actual` (`+`).
pub(crate) fn unified(expected: &str, actual: &str, expected_name: &str) -> Option<String> {
    let old: Vec<&str> = expected.lines().collect();
    let new: Vec<&str> = actual.lines().collect();
    if old == new {
        return None;
    }
    let ops = edit_script(&old, &new);
    Some(render(&ops, expected_name))
}

/// The edit script as (op, line) in order: common prefix and suffix kept, the middle aligned
/// by longest common subsequence.
fn edit_script<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<(Op, &'a str)> {
    let prefix = old.iter().zip(new).take_while(|(a, b)| a == b).count();
    let suffix = old[prefix..]
        .iter()
        .rev()
        .zip(new[prefix..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let (a, b) = (
        &old[prefix..old.len() - suffix],
        &new[prefix..new.len() - suffix],
    );
    let mut ops: Vec<(Op, &str)> = old[..prefix].iter().map(|l| (Op::Same, *l)).collect();
    if a.len().saturating_mul(b.len()) > MAX_ALIGN_CELLS {
        ops.extend(a.iter().map(|l| (Op::Removed, *l)));
        ops.extend(b.iter().map(|l| (Op::Added, *l)));
    } else {
        ops.extend(align(a, b));
    }
    ops.extend(old[old.len() - suffix..].iter().map(|l| (Op::Same, *l)));
    ops
}

/// Longest-common-subsequence alignment (quadratic; callers bound the size).
fn align<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<(Op, &'a str)> {
    let (n, m) = (a.len(), b.len());
    // lcs[i][j]: LCS length of a[i..] and b[j..], row-major with stride m + 1.
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * (m + 1) + j] = if a[i] == b[j] {
                lcs[(i + 1) * (m + 1) + j + 1] + 1
            } else {
                lcs[(i + 1) * (m + 1) + j].max(lcs[i * (m + 1) + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut ops = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((Op::Same, a[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[(i + 1) * (m + 1) + j] >= lcs[i * (m + 1) + j + 1]) {
            // Removals first on a tie, as `diff -u` shows a changed line.
            ops.push((Op::Removed, a[i]));
            i += 1;
        } else {
            ops.push((Op::Added, b[j]));
            j += 1;
        }
    }
    ops
}

fn render(ops: &[(Op, &str)], expected_name: &str) -> String {
    let mut out = format!("--- {expected_name}\n+++ plugin output\n");
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != Op::Same).collect();
    let mut printed = 0;
    let mut k = 0;
    while k < changed.len() {
        // One hunk: changes closer than 2 × CONTEXT lines apart share it.
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 2 * CONTEXT {
            end = changed[k];
            k += 1;
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let (old_start, new_start) = positions(&ops[..start]);
        let (old_len, new_len) = positions(&ops[start..end]);
        out.push_str(&format!(
            "@@ -{},{old_len} +{},{new_len} @@\n",
            old_start + 1,
            new_start + 1
        ));
        for (op, line) in &ops[start..end] {
            if printed == MAX_DIFF_LINES {
                out.push_str(&format!(
                    "… diff cut after {MAX_DIFF_LINES} lines ({} changed lines in all)\n",
                    changed.len()
                ));
                return out;
            }
            let sign = match op {
                Op::Same => ' ',
                Op::Removed => '-',
                Op::Added => '+',
            };
            out.push(sign);
            out.push_str(line);
            out.push('\n');
            printed += 1;
        }
    }
    out
}

/// Lines of the expected and the actual side covered by `ops`.
fn positions(ops: &[(Op, &str)]) -> (usize, usize) {
    ops.iter().fold((0, 0), |(o, n), (op, _)| match op {
        Op::Same => (o + 1, n + 1),
        Op::Removed => (o + 1, n),
        Op::Added => (o, n + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_texts_have_no_diff_whatever_the_final_newline() {
        assert_eq!(unified("a\nb\n", "a\nb", "e"), None);
    }

    #[test]
    fn a_changed_line_is_shown_with_its_context_and_position() {
        let expected: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let actual = expected.replace("line 10\n", "line ten\n");
        let diff = unified(&expected, &actual, "expected.jsonl").unwrap();
        assert_eq!(
            diff,
            "--- expected.jsonl\n+++ plugin output\n@@ -7,7 +7,7 @@\n line 7\n line 8\n line 9\n\
             -line 10\n+line ten\n line 11\n line 12\n line 13\n"
        );
    }

    #[test]
    fn missing_and_extra_lines_are_aligned() {
        let diff = unified("a\nb\nc\nd\n", "a\nc\nd\ne\n", "x").unwrap();
        assert!(diff.contains("\n-b\n"), "{diff}");
        assert!(diff.contains("\n+e\n"), "{diff}");
        assert!(!diff.contains("-c") && !diff.contains("+c"), "{diff}");
    }

    #[test]
    fn far_apart_changes_get_separate_hunks() {
        let expected: String = (1..=40).map(|i| format!("{i}\n")).collect();
        let actual = expected
            .replace("\n5\n", "\nfive\n")
            .replace("\n35\n", "\nx\n");
        let diff = unified(&expected, &actual, "x").unwrap();
        assert_eq!(diff.matches("@@ -").count(), 2, "{diff}");
    }

    #[test]
    fn a_huge_diff_is_cut() {
        let expected: String = (0..5_000).map(|i| format!("{i}\n")).collect();
        let actual: String = (0..5_000).map(|i| format!("x{i}\n")).collect();
        let diff = unified(&expected, &actual, "x").unwrap();
        assert!(diff.lines().count() < MAX_DIFF_LINES + 10);
        assert!(
            diff.contains("diff cut after"),
            "{}",
            &diff[diff.len() - 200..]
        );
    }
}
