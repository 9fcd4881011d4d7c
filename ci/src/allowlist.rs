//! Who may trigger the bot besides being an owner, member or collaborator: the logins listed
//! in the repository's allow-list file (`.github/bot-allowlist.txt`), one per line, `#`
//! starting a comment. Logins compare case-insensitively, as GitHub's do.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum AllowListError {
    #[error("allow-list line {line}: `{text}` is not a GitHub login")]
    BadLogin { line: usize, text: String },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowList {
    logins: Vec<String>,
}

fn is_login(s: &str) -> bool {
    // GitHub: 1 to 39 alphanumerics or single hyphens, not starting or ending with one.
    !s.is_empty()
        && s.len() <= 39
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl AllowList {
    pub fn parse(text: &str) -> Result<AllowList, AllowListError> {
        let mut logins = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            if !is_login(line) {
                return Err(AllowListError::BadLogin {
                    line: i + 1,
                    text: line.to_string(),
                });
            }
            logins.push(line.to_ascii_lowercase());
        }
        Ok(AllowList { logins })
    }

    /// The logins listed, in lower case, in the file's order.
    pub fn logins(&self) -> &[String] {
        &self.logins
    }

    pub fn allows(&self, login: &str) -> bool {
        let login = login.to_ascii_lowercase();
        self.logins.contains(&login)
    }
}

/// The author associations GitHub gives people with write access.
pub const TRUSTED_ASSOCIATIONS: &[&str] = &["OWNER", "MEMBER", "COLLABORATOR"];

/// Both gates: a trusted association and a listed login.
pub fn authorized(list: &AllowList, login: &str, association: &str) -> bool {
    TRUSTED_ASSOCIATIONS.contains(&association) && list.allows(login)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_collaborators_only() {
        let list = AllowList::parse("# maintainers\nAlice\n  bob-2  # ci\n\n").unwrap();
        assert!(authorized(&list, "alice", "OWNER"));
        assert!(authorized(&list, "BOB-2", "COLLABORATOR"));
        assert!(!authorized(&list, "alice", "CONTRIBUTOR"));
        assert!(!authorized(&list, "alice", "NONE"));
        assert!(!authorized(&list, "mallory", "MEMBER"));
        assert!(!authorized(&list, "", "MEMBER"));
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert_eq!(
            AllowList::parse("alice\nbad login\n"),
            Err(AllowListError::BadLogin {
                line: 2,
                text: "bad login".into()
            })
        );
        assert!(AllowList::parse("-x").is_err());
    }
}
