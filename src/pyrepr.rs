//! Python's `repr` of the values that the reference's error messages embed: strings,
//! integers, tuples and lists of them (`('a', 'b', 'c')`, `[('key', -1)]`).
//!
//! The reference formats these with f-strings, so a message that names an address
//! space prints `('inst', 'worker', 'cuda:0')`, quotes and escapes included; matching
//! it keeps our messages byte-equal to the reference's (the conformance runner
//! compares them).
//!
//! Strings follow CPython's `unicode_repr`: single quotes unless the text holds a `'`
//! and no `"`; `\\`, the chosen quote, `\t`, `\n` and `\r` escaped; other control
//! characters as `\xhh`; non-ASCII characters kept as they are when printable, else
//! `\xhh`, `\uhhhh` or `\Uhhhhhhhh`. "Printable" is Python's `str.isprintable` for
//! every assigned character (control, format, separator other than the space,
//! private-use and surrogate categories are not); unassigned code points other than
//! the noncharacters are kept as they are, since which ones are unassigned depends
//! on the Unicode version of the Python that runs the reference.

/// A value that renders as Python's `repr` would.
pub(crate) trait PyRepr {
    /// Appends the repr of `self` to `out`.
    fn write_repr(&self, out: &mut String);
}

/// Python's `repr(value)`.
pub(crate) fn repr<T: PyRepr + ?Sized>(value: &T) -> String {
    let mut out = String::new();
    value.write_repr(&mut out);
    out
}

impl PyRepr for str {
    fn write_repr(&self, out: &mut String) {
        let quote = if self.contains('\'') && !self.contains('"') { '"' } else { '\'' };
        out.push(quote);
        for c in self.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                c if c == quote => {
                    out.push('\\');
                    out.push(c);
                }
                c if printable(c) => out.push(c),
                c => {
                    let n = c as u32;
                    let text = if n <= 0xff {
                        format!("\\x{n:02x}")
                    } else if n <= 0xffff {
                        format!("\\u{n:04x}")
                    } else {
                        format!("\\U{n:08x}")
                    };
                    out.push_str(&text);
                }
            }
        }
        out.push(quote);
    }
}

impl PyRepr for String {
    fn write_repr(&self, out: &mut String) {
        self.as_str().write_repr(out)
    }
}

impl<T: PyRepr + ?Sized> PyRepr for &T {
    fn write_repr(&self, out: &mut String) {
        (**self).write_repr(out)
    }
}

macro_rules! int_repr {
    ($($t:ty),*) => {$(
        impl PyRepr for $t {
            fn write_repr(&self, out: &mut String) {
                out.push_str(&self.to_string());
            }
        }
    )*};
}
int_repr!(i32, i64, u32, u64);

impl<A: PyRepr, B: PyRepr> PyRepr for (A, B) {
    fn write_repr(&self, out: &mut String) {
        out.push('(');
        self.0.write_repr(out);
        out.push_str(", ");
        self.1.write_repr(out);
        out.push(')');
    }
}

impl<A: PyRepr, B: PyRepr, C: PyRepr> PyRepr for (A, B, C) {
    fn write_repr(&self, out: &mut String) {
        out.push('(');
        self.0.write_repr(out);
        out.push_str(", ");
        self.1.write_repr(out);
        out.push_str(", ");
        self.2.write_repr(out);
        out.push(')');
    }
}

/// A Python list: `[a, b]`.
impl<T: PyRepr> PyRepr for [T] {
    fn write_repr(&self, out: &mut String) {
        out.push('[');
        for (i, v) in self.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            v.write_repr(out);
        }
        out.push(']');
    }
}

impl<T: PyRepr> PyRepr for Vec<T> {
    fn write_repr(&self, out: &mut String) {
        self.as_slice().write_repr(out)
    }
}

/// `str.isprintable` of one character, for assigned characters (see the module docs).
fn printable(c: char) -> bool {
    let n = c as u32;
    if n < 0x7f {
        return n >= 0x20;
    }
    !matches!(n,
        // Cc: DEL and the C1 controls.
        0x7f..=0x9f
        // Zs (other than the space), Zl, Zp.
        | 0xa0 | 0x1680 | 0x2000..=0x200a | 0x2028 | 0x2029 | 0x202f | 0x205f | 0x3000
        // Cf.
        | 0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x890..=0x891 | 0x8e2 | 0x180e
        | 0x200b..=0x200f | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff
        | 0xfff9..=0xfffb | 0x110bd | 0x110cd | 0x13430..=0x1343f | 0x1bca0..=0x1bca3
        | 0x1d173..=0x1d17a | 0xe0001 | 0xe0020..=0xe007f
        // Co: private use.
        | 0xe000..=0xf8ff | 0xf0000..=0xffffd | 0x100000..=0x10fffd
        // Cn: the noncharacters (assigned to no character in any version).
        | 0xfdd0..=0xfdef)
        && n & 0xfffe != 0xfffe
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_render_as_python_repr() {
        // Each expected text is what CPython 3.12 prints for repr() of the input.
        let cases: &[(&str, &str)] = &[
            ("abc", "'abc'"),
            ("", "''"),
            ("it's", "\"it's\""),
            ("it's \"x\"", "'it\\'s \"x\"'"),
            ("say \"hi\"", "'say \"hi\"'"),
            ("back\\slash", "'back\\\\slash'"),
            ("tab\tnl\ncr\r", "'tab\\tnl\\ncr\\r'"),
            ("\u{0}\u{1f}\u{7f}", "'\\x00\\x1f\\x7f'"),
            ("\u{85}\u{a0}\u{ad}", "'\\x85\\xa0\\xad'"),
            ("γ-worker 节点 ü", "'γ-worker 节点 ü'"),
            ("\u{200b}\u{2028}\u{feff}", "'\\u200b\\u2028\\ufeff'"),
            ("\u{e000}\u{fffe}", "'\\ue000\\ufffe'"),
            ("\u{1f600}", "'\u{1f600}'"),
            ("\u{e0001}\u{10fffd}", "'\\U000e0001\\U0010fffd'"),
        ];
        for (input, expected) in cases {
            assert_eq!(repr(*input), *expected, "repr of {input:?}");
        }
    }

    #[test]
    fn tuples_and_lists_render_as_python_repr() {
        assert_eq!(repr(&("γ-src", "src:γ", "cuda:0")), "('γ-src', 'src:γ', 'cuda:0')");
        assert_eq!(repr(&vec![("k", "boom"), ("k2", "it's")]), "[('k', 'boom'), ('k2', \"it's\")]");
        assert_eq!(repr(&vec![(140_000u64, -1i64)]), "[(140000, -1)]");
        assert_eq!(repr(&Vec::<u64>::new()), "[]");
    }
}
