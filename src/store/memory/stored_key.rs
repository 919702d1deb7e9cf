//! A session key as the embedded store holds it: in its binding's slot, not behind a pointer.
//!
//! At a million bindings, a lookup's misses to memory are what it costs; a boxed key is one
//! more (its bytes, to compare) after the table's control bytes and slot. So the key lives in
//! the slot: a key the gateway mints (`X-Pool-Session: create`, 32 lowercase hex digits) as its
//! 16 bytes, any key of up to [`INLINE`] bytes as it is, and only a longer one boxed. A key's
//! form is a function of its text, so one text has one form: a 32-hex key is never also held
//! boxed, and uppercase hex is a key of its own, as it always was.

/// The longest key held in the slot as text: what fits beside the form's tag and length in
/// the 24 bytes a boxed key takes anyway.
pub(super) const INLINE: usize = 22;

/// Hex digits in a key the gateway mints (`session::mint_key`).
const HEX_DIGITS: usize = 32;

/// A session key held in a slot.
pub(super) enum StoredKey {
    /// 32 lowercase hex digits, as the 16 bytes they spell.
    Hex([u8; HEX_DIGITS / 2]),
    /// Any other key of up to [`INLINE`] bytes: its first `len` bytes.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Any other key.
    Boxed(Box<str>),
}

// The key's part of the slot: a boxed `str`'s 16 bytes and the form's tag, rounded up to the
// slot's alignment. Hex and inline keys fit in the padding the boxed form leaves.
const _: () = assert!(size_of::<StoredKey>() == 24);

/// A key to look up, put in the form it is stored in: made once per store call, from `&str`,
/// without allocating.
#[derive(Clone, Copy)]
pub(super) enum Probe<'a> {
    Hex([u8; HEX_DIGITS / 2]),
    Text(&'a str),
}

impl<'a> Probe<'a> {
    pub fn new(key: &'a str) -> Self {
        match hex_bytes(key) {
            Some(b) => Probe::Hex(b),
            None => Probe::Text(key),
        }
    }

    /// What the key's hash is taken over; the same bytes as [`StoredKey::hashed`] of its
    /// stored form.
    pub fn hashed(&self) -> &[u8] {
        match self {
            Probe::Hex(b) => b,
            Probe::Text(s) => s.as_bytes(),
        }
    }

    /// The key in its stored form (a key over [`INLINE`] bytes is allocated).
    pub fn to_stored(self) -> StoredKey {
        match self {
            Probe::Hex(b) => StoredKey::Hex(b),
            Probe::Text(s) if s.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..s.len()].copy_from_slice(s.as_bytes());
                StoredKey::Inline {
                    len: s.len() as u8,
                    bytes,
                }
            }
            Probe::Text(s) => StoredKey::Boxed(s.into()),
        }
    }
}

impl StoredKey {
    /// Whether this is the key `probe` names.
    pub fn is(&self, probe: &Probe<'_>) -> bool {
        match (self, probe) {
            (StoredKey::Hex(a), Probe::Hex(b)) => a == b,
            (StoredKey::Inline { len, bytes }, Probe::Text(s)) => {
                &bytes[..*len as usize] == s.as_bytes()
            }
            (StoredKey::Boxed(a), Probe::Text(s)) => **a == **s,
            _ => false,
        }
    }

    /// What the key's hash is taken over (see [`Probe::hashed`]).
    pub fn hashed(&self) -> &[u8] {
        match self {
            StoredKey::Hex(b) => b,
            StoredKey::Inline { len, bytes } => &bytes[..*len as usize],
            StoredKey::Boxed(s) => s.as_bytes(),
        }
    }

    /// The key's text, as the client sent it.
    #[cfg(test)]
    pub fn text(&self) -> String {
        match self {
            StoredKey::Hex(b) => b.iter().map(|b| format!("{b:02x}")).collect(),
            StoredKey::Inline { .. } => String::from_utf8_lossy(self.hashed()).into_owned(),
            StoredKey::Boxed(s) => s.to_string(),
        }
    }
}

/// The 16 bytes `key` spells, if it is exactly 32 lowercase hex digits.
///
/// Without a branch per digit: on random digits a branch on "digit or letter" is mispredicted
/// half the time, and that alone cost a lookup about 100 ns.
fn hex_bytes(key: &str) -> Option<[u8; HEX_DIGITS / 2]> {
    let digits: &[u8; HEX_DIGITS] = key.as_bytes().try_into().ok()?;
    let mut hex = true;
    for &d in digits {
        hex &= (d.wrapping_sub(b'0') < 10) | (d.wrapping_sub(b'a') < 6);
    }
    if !hex {
        return None;
    }
    let mut out = [0; HEX_DIGITS / 2];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        *o = (nibble(pair[0]) << 4) | nibble(pair[1]);
    }
    Some(out)
}

/// A lowercase hex digit's value: `'0'..='9'` are 0x30–0x39, `'a'..='f'` 0x61–0x66.
fn nibble(digit: u8) -> u8 {
    (digit & 0xf) + 9 * (digit >> 6)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(key: &str) -> &'static str {
        match Probe::new(key).to_stored() {
            StoredKey::Hex(_) => "hex",
            StoredKey::Inline { .. } => "inline",
            StoredKey::Boxed(_) => "boxed",
        }
    }

    #[test]
    fn each_key_has_one_form_and_keeps_its_text() {
        let minted = crate::session::mint_key().to_string();
        let cases: &[(&str, &str)] = &[
            (minted.as_str(), "hex"),
            ("0123456789abcdef0123456789abcdef", "hex"),
            ("00000000000000000000000000000000", "hex"),
            ("ffffffffffffffffffffffffffffffff", "hex"),
            // Uppercase or mixed-case hex is another key, with a form of its own.
            ("0123456789ABCDEF0123456789ABCDEF", "boxed"),
            ("0123456789abcdef0123456789abcdeF", "boxed"),
            // One digit short or over, or one character outside the digits.
            ("0123456789abcdef0123456789abcde", "boxed"),
            ("0123456789abcdef0123456789abcdef0", "boxed"),
            ("0123456789abcdef0123456789abcdeg", "boxed"),
            ("0123456789abcdef 123456789abcdef", "boxed"),
            ("", "inline"),
            ("k", "inline"),
            ("user-42", "inline"),
            ("abcdefghijklmnopqrstuv", "inline"),
            ("abcdefghijklmnopqrstuvw", "boxed"),
            ("ключ", "inline"),
            ("ключ-сессии-номер-один", "boxed"),
            ("🔑🔑🔑🔑🔑", "inline"),
            ("🔑🔑🔑🔑🔑🔑", "boxed"),
        ];
        for &(key, want) in cases {
            assert_eq!(form(key), want, "{key:?}");
            let stored = Probe::new(key).to_stored();
            assert_eq!(stored.text(), key);
            assert!(stored.is(&Probe::new(key)), "{key:?} is not itself");
            assert_eq!(stored.hashed(), Probe::new(key).hashed(), "{key:?}");
            for &(other, _) in cases.iter().filter(|(o, _)| *o != key) {
                assert!(!stored.is(&Probe::new(other)), "{key:?} is {other:?}");
            }
        }
    }

    #[test]
    fn a_hex_key_is_its_16_bytes() {
        let key = "00112233445566778899aabbccddeeff";
        let Probe::Hex(b) = Probe::new(key) else {
            panic!("{key} is not in hex form");
        };
        assert_eq!(
            b,
            [
                0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
                0xee, 0xff
            ]
        );
    }

    #[test]
    fn only_lowercase_hex_digits_decode() {
        // Every ASCII character, and a two-byte one, in the first and the last place of a key.
        let chars = (0u8..128).map(char::from).chain(['é', 'ÿ']);
        for c in chars {
            for at in [0, 1, 30] {
                let mut key = String::from("0123456789abcdef0123456789abcdef");
                key.replace_range(at..at + c.len_utf8(), c.encode_utf8(&mut [0; 4]));
                let want = c.is_ascii_hexdigit() && !c.is_ascii_uppercase();
                let got = hex_bytes(&key);
                assert_eq!(got.is_some(), want, "{key:?}");
                if let Some(b) = got {
                    assert_eq!(
                        u128::from_be_bytes(b),
                        u128::from_str_radix(&key, 16).unwrap()
                    );
                }
            }
        }
    }

    #[test]
    fn the_forms_never_meet() {
        // The same bytes held as hex and as text are two keys, whichever is probed.
        let raw = [b'a'; 16];
        let as_text = std::str::from_utf8(&raw).unwrap();
        let hex = StoredKey::Hex(raw);
        assert!(!hex.is(&Probe::Text(as_text)));
        assert!(!Probe::Text(as_text).to_stored().is(&Probe::Hex(raw)));
        // A boxed key is never what a hex probe names, even with the same text.
        let text = "0123456789abcdef0123456789abcdef";
        let boxed = StoredKey::Boxed(text.into());
        assert!(!boxed.is(&Probe::new(text)));
    }
}
