//! Scopes: what a client may do, one per RPC. Settings name them
//! (`auth.clients[].scopes`, checked at load), and each caller holds its
//! own as a [`ScopeSet`] ([`crate::auth`]).

use std::fmt;
use std::str::FromStr;

/// Something a client may do. Each RPC needs exactly one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Send to user lists (SendMessage, the draft flow) and to groups.
    Send,
    /// Send to every user (an announcement): reaches everyone, so separate.
    SendAllUsers,
    /// Mark a send critical: it ignores the recipients' mutes.
    SendCritical,
    /// Pause, resume, cancel and redrive sends.
    SendsManage,
    /// Read and watch sends.
    SendsRead,
    /// Read and manage every client's sends, not only its own.
    SendsAll,
    /// Read inboxes, badges, preferences and group messages.
    InboxRead,
    /// Change inbox items (seen, read, archived, deleted) and preferences,
    /// and acknowledge group messages.
    InboxWrite,
    /// Create groups and change their members.
    GroupsManage,
    /// Subscribe to users' live events (gateways).
    EventsSubscribe,
    /// Look around the web console (sends, users, groups, shards).
    ConsoleRead,
    /// Use the console's buttons too (pause, resume, cancel, redrive,
    /// recall), as `sends.manage` and `sends.all` would.
    ConsoleManage,
    /// Everything, including the audit log and erasing users.
    Admin,
}

impl Scope {
    /// Every scope, in documentation order.
    pub const ALL: [Scope; 13] = [
        Scope::Send,
        Scope::SendAllUsers,
        Scope::SendCritical,
        Scope::SendsManage,
        Scope::SendsRead,
        Scope::SendsAll,
        Scope::InboxRead,
        Scope::InboxWrite,
        Scope::GroupsManage,
        Scope::EventsSubscribe,
        Scope::ConsoleRead,
        Scope::ConsoleManage,
        Scope::Admin,
    ];

    /// Returns the name used in settings and errors.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Send => "send",
            Scope::SendAllUsers => "send.all_users",
            Scope::SendCritical => "send.critical",
            Scope::SendsManage => "sends.manage",
            Scope::SendsRead => "sends.read",
            Scope::SendsAll => "sends.all",
            Scope::InboxRead => "inbox.read",
            Scope::InboxWrite => "inbox.write",
            Scope::GroupsManage => "groups.manage",
            Scope::EventsSubscribe => "events.subscribe",
            Scope::ConsoleRead => "console.read",
            Scope::ConsoleManage => "console.manage",
            Scope::Admin => "admin",
        }
    }

    /// Returns every scope name.
    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|scope| scope.name()).collect()
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|scope| scope.name() == name)
            .ok_or_else(|| format!("unknown scope {name:?}"))
    }
}

/// A set of scopes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScopeSet(u16);

impl ScopeSet {
    /// Every scope.
    pub fn all() -> Self {
        Self(Scope::ALL.iter().fold(0, |bits, scope| bits | scope.bit()))
    }

    /// Returns the set with `scope` added.
    pub fn with(self, scope: Scope) -> Self {
        Self(self.0 | scope.bit())
    }

    /// Returns true if the set holds `scope` itself (not through admin).
    pub fn holds(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }
}

impl FromIterator<Scope> for ScopeSet {
    fn from_iter<I: IntoIterator<Item = Scope>>(scopes: I) -> Self {
        scopes.into_iter().fold(Self::default(), Self::with)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_names_round_trip() {
        for scope in Scope::ALL {
            assert_eq!(scope.name().parse::<Scope>().unwrap(), scope);
        }
        assert!("sends.delete".parse::<Scope>().is_err());
    }
}
