//! The lexer: MLIR text to tokens, each with its position.
//!
//! Numbers are lexed together with the letters that follow them, so a shape such as
//! `2x3xf32` is one [`Tok::Number`] token that the type parser splits; `-` starts a number
//! only before a digit. Comments (`//` to the end of the line) are skipped.

use crate::error::{Error, Pos, Result, quote};

/// A token. Text tokens borrow from the input.
#[derive(Clone, Debug, PartialEq)]
pub enum Tok<'a> {
    /// `%name` or `%name#3` (without the `%`).
    Value(&'a str),
    /// `@name` (without the `@`).
    Symbol(&'a str),
    /// A bare identifier: `stablehlo.add`, `tensor`, `EQ`, `x`.
    Ident(&'a str),
    /// A number, possibly with letters after it: `-1.5e-3`, `0x7F800000`, `2x3xf32`.
    Number(&'a str),
    /// A string literal, unescaped.
    Str(String),
    /// `#name` (without the `#`): an attribute alias or dialect attribute.
    Hash(&'a str),
    /// `^name` (without the `^`): a block label.
    Caret(&'a str),
    /// `!name` (without the `!`): a dialect type.
    Bang(&'a str),
    /// Punctuation: `( ) [ ] { } < > , : = -> ? *`.
    Punct(&'static str),
    /// The end of the input.
    Eof,
}

impl Tok<'_> {
    /// The token as it would be written, for error messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Value(s) => quote(&format!("%{s}")),
            Tok::Symbol(s) => quote(&format!("@{s}")),
            Tok::Ident(s) | Tok::Number(s) => quote(s),
            Tok::Str(s) => quote(&format!("\"{s}\"")),
            Tok::Hash(s) => quote(&format!("#{s}")),
            Tok::Caret(s) => quote(&format!("^{s}")),
            Tok::Bang(s) => quote(&format!("!{s}")),
            Tok::Punct(p) => format!("`{p}`"),
            Tok::Eof => "the end of the input".to_string(),
        }
    }
}

/// A token and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub struct Spanned<'a> {
    /// The token.
    pub tok: Tok<'a>,
    /// Its first character.
    pub pos: Pos,
}

const PUNCTS: [&str; 13] = [
    "(", ")", "[", "]", "{", "}", "<", ">", ",", ":", "=", "?", "*",
];

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_ident_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$')
}

/// The character count of a line up to a byte offset, cached.
#[derive(Default)]
struct Column {
    line_start: usize,
    byte: usize,
    chars: u32,
}

impl Column {
    fn pos(&mut self, src: &str, i: usize, line: u32, line_start: usize) -> Pos {
        if self.line_start != line_start || self.byte > i {
            *self = Column {
                line_start,
                byte: line_start,
                chars: 0,
            };
        }
        self.chars += src[self.byte..i].chars().count() as u32;
        self.byte = i;
        Pos {
            line,
            column: self.chars + 1,
        }
    }
}

/// Lexes `src`, whose first line is line `first_line` of the whole input.
pub fn lex(src: &str, first_line: u32) -> Result<Vec<Spanned<'_>>> {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(src.len() / 4);
    let (mut i, mut line, mut line_start) = (0usize, first_line, 0usize);
    // Columns count characters, not bytes; the count so far on the line is cached, so long
    // lines cost linear time.
    let mut col = Column::default();
    let mut pos_of = |i: usize, line: u32, line_start: usize| col.pos(src, i, line, line_start);
    while i < b.len() {
        let c = b[i];
        let start = i;
        let pos = pos_of(i, line, line_start);
        match c {
            b'\n' => {
                i += 1;
                line += 1;
                line_start = i;
                continue;
            }
            b' ' | b'\t' | b'\r' => {
                i += 1;
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'-' if b.get(i + 1) == Some(&b'>') => {
                i += 2;
                out.push(Spanned {
                    tok: Tok::Punct("->"),
                    pos,
                });
                continue;
            }
            b'"' => {
                i += 1;
                let mut s = String::new();
                loop {
                    match b.get(i) {
                        None | Some(b'\n') => {
                            return Err(Error::syntax(pos, "unterminated string literal"));
                        }
                        Some(b'"') => {
                            i += 1;
                            break;
                        }
                        Some(b'\\') => {
                            let Some(&e) = b.get(i + 1) else {
                                return Err(Error::syntax(pos, "unterminated string literal"));
                            };
                            match e {
                                b'n' => s.push('\n'),
                                b't' => s.push('\t'),
                                b'"' => s.push('"'),
                                b'\\' => s.push('\\'),
                                _ if e.is_ascii_hexdigit()
                                    && b.get(i + 2).is_some_and(|h| h.is_ascii_hexdigit()) =>
                                {
                                    let h = &src[i + 1..i + 3];
                                    s.push(u8::from_str_radix(h, 16).unwrap_or(b'?') as char);
                                    i += 1;
                                }
                                _ => {
                                    return Err(Error::syntax(
                                        pos_of(i, line, line_start),
                                        "unknown escape in a string literal",
                                    ));
                                }
                            }
                            i += 2;
                        }
                        Some(_) => {
                            let ch = src[i..].chars().next().unwrap_or('?');
                            s.push(ch);
                            i += ch.len_utf8();
                        }
                    }
                }
                out.push(Spanned {
                    tok: Tok::Str(s),
                    pos,
                });
                continue;
            }
            _ => {}
        }
        let sigil = matches!(c, b'%' | b'@' | b'#' | b'^' | b'!');
        if sigil {
            i += 1;
            // `@"quoted name"` and `%"..."` are not supported; names are bare.
            let name_start = i;
            while i < b.len()
                && (is_ident_char(b[i]) || b[i] == b'-' || (c == b'%' && b[i] == b'#'))
            {
                i += 1;
            }
            if i == name_start {
                return Err(Error::syntax(
                    pos,
                    format!("expected a name after `{}`", c as char),
                ));
            }
            let name = &src[name_start..i];
            let tok = match c {
                b'%' => Tok::Value(name),
                b'@' => Tok::Symbol(name),
                b'#' => Tok::Hash(name),
                b'^' => Tok::Caret(name),
                _ => Tok::Bang(name),
            };
            out.push(Spanned { tok, pos });
        } else if c.is_ascii_digit() || (c == b'-' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            i += 1;
            let hex = c == b'0'
                && matches!(b.get(i), Some(b'x'))
                && b.get(i + 1).is_some_and(u8::is_ascii_hexdigit);
            while i < b.len() {
                let d = b[i];
                let exp_sign = matches!(d, b'+' | b'-')
                    && !hex
                    && matches!(b[i - 1], b'e' | b'E')
                    && b[start..i - 1]
                        .iter()
                        .all(|x| x.is_ascii_digit() || matches!(x, b'.' | b'-'))
                    && b.get(i + 1).is_some_and(u8::is_ascii_digit);
                if d.is_ascii_alphanumeric() || d == b'_' || d == b'.' || exp_sign {
                    i += 1;
                } else {
                    break;
                }
            }
            out.push(Spanned {
                tok: Tok::Number(&src[start..i]),
                pos,
            });
        } else if is_ident_start(c) {
            while i < b.len() && is_ident_char(b[i]) {
                i += 1;
            }
            out.push(Spanned {
                tok: Tok::Ident(&src[start..i]),
                pos,
            });
        } else if let Some(p) = PUNCTS.iter().find(|p| p.as_bytes()[0] == c) {
            i += 1;
            out.push(Spanned {
                tok: Tok::Punct(p),
                pos,
            });
        } else {
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(Error::syntax(pos, format!("unexpected character `{ch}`")));
        }
    }
    out.push(Spanned {
        tok: Tok::Eof,
        pos: pos_of(i, line, line_start),
    });
    Ok(out)
}

/// The position of the first byte of `bytes` that is not valid UTF-8, as a line and column.
pub fn utf8_error_pos(bytes: &[u8], valid_up_to: usize) -> Pos {
    let before = &bytes[..valid_up_to];
    let line = before.iter().filter(|&&c| c == b'\n').count() as u32 + 1;
    let line_start = before
        .iter()
        .rposition(|&c| c == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count() as u32
        + 1;
    Pos { line, column }
}
