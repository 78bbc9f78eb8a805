//! What each RPC needs: the one table every call is checked against before
//! any handler runs. A method missing here is refused to everyone (and the
//! scope test over the service descriptors fails), so a new RPC cannot ship
//! without a decision.

use std::collections::HashMap;
use std::sync::LazyLock;

use notify_domain::auth::Scope;

/// What a call to one method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requirement {
    /// Nothing: health checks stay open to probes and load balancers.
    Open,
    /// gRPC reflection, as `api.reflection` says.
    Reflection,
    /// A client with this scope.
    Scope(Scope),
    /// `SendMessage`: `send`, or `send.all_users` when the audience is all
    /// users (read from the request message before the handler runs).
    SendByAudience,
}

/// One method's entry.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// Full gRPC path, `/package.Service/Method`.
    pub path: &'static str,
    /// What a call needs.
    pub requirement: Requirement,
    /// The handler writes its own audit record (lifecycle actions); other
    /// methods are audited by the layer when only `admin` lets the caller in.
    pub audited_by_handler: bool,
}

const fn rule(path: &'static str, scope: Scope, audited_by_handler: bool) -> Rule {
    Rule { path, requirement: Requirement::Scope(scope), audited_by_handler }
}

/// Every method of every Notify service.
pub const RULES: &[Rule] = &[
    Rule {
        path: "/notify.v1.MessageService/SendMessage",
        requirement: Requirement::SendByAudience,
        audited_by_handler: true,
    },
    rule("/notify.v1.MessageService/CreateMessage", Scope::Send, true),
    rule("/notify.v1.MessageService/AppendRecipients", Scope::Send, false),
    rule("/notify.v1.MessageService/StartMessage", Scope::Send, true),
    rule("/notify.v1.MessageService/GetMessage", Scope::SendsRead, false),
    rule("/notify.v1.MessageService/WatchMessage", Scope::SendsRead, false),
    rule("/notify.v1.MessageService/ListMessages", Scope::SendsRead, false),
    rule("/notify.v1.MessageService/PauseMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/ResumeMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/CancelMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/RedriveMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/RecallMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/EditMessage", Scope::SendsManage, true),
    rule("/notify.v1.MessageService/ListRecipients", Scope::SendsRead, false),
    rule("/notify.v1.MessageService/GetRecipientStatus", Scope::SendsRead, false),
    rule("/notify.v1.EventService/Subscribe", Scope::EventsSubscribe, false),
    rule("/notify.v1.InboxService/ListInbox", Scope::InboxRead, false),
    rule("/notify.v1.InboxService/MarkRead", Scope::InboxWrite, false),
    rule("/notify.v1.InboxService/MarkAllRead", Scope::InboxWrite, false),
    rule("/notify.v1.InboxService/UpdateItems", Scope::InboxWrite, false),
    rule("/notify.v1.InboxService/SetPreferences", Scope::InboxWrite, false),
    rule("/notify.v1.InboxService/GetPreferences", Scope::InboxRead, false),
    rule("/notify.v1.InboxService/GetUnreadCount", Scope::InboxRead, false),
    rule("/notify.v1.InboxService/BatchGetUnreadCounts", Scope::InboxRead, false),
    rule("/notify.v1.GroupService/CreateGroup", Scope::GroupsManage, true),
    rule("/notify.v1.GroupService/AddGroupMembers", Scope::GroupsManage, true),
    rule("/notify.v1.GroupService/RemoveGroupMembers", Scope::GroupsManage, true),
    rule("/notify.v1.GroupService/SendGroupMessage", Scope::Send, false),
    rule("/notify.v1.GroupService/PullGroupMessages", Scope::InboxRead, false),
    rule("/notify.v1.GroupService/AckGroupMessages", Scope::InboxWrite, false),
    rule("/notify.v1.GroupService/GetGroupUnread", Scope::InboxRead, false),
    rule("/notify.v1.GroupService/RecallGroupMessage", Scope::SendsManage, true),
    rule("/notify.v1.AdminService/ListAuditRecords", Scope::Admin, false),
    rule("/notify.v1.AdminService/EraseUser", Scope::Admin, true),
];

/// Health, open to everyone.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";
/// Reflection, both protocol versions.
const REFLECTION_PREFIXES: [&str; 2] =
    ["/grpc.reflection.v1.ServerReflection/", "/grpc.reflection.v1alpha.ServerReflection/"];

/// Finds the rule of a request path; `None` for a method nobody decided on.
pub fn rule_for(path: &str) -> Option<Rule> {
    if path.starts_with(HEALTH_PREFIX) {
        return Some(Rule {
            path: HEALTH_PREFIX,
            requirement: Requirement::Open,
            audited_by_handler: false,
        });
    }
    if REFLECTION_PREFIXES.iter().any(|prefix| path.starts_with(prefix)) {
        return Some(Rule {
            path: REFLECTION_PREFIXES[0],
            requirement: Requirement::Reflection,
            audited_by_handler: false,
        });
    }
    static BY_PATH: LazyLock<HashMap<&'static str, Rule>> =
        LazyLock::new(|| RULES.iter().map(|rule| (rule.path, *rule)).collect());
    BY_PATH.get(path).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rule_is_found_by_its_path_and_health_is_open() {
        for rule in RULES {
            assert_eq!(rule_for(rule.path).unwrap().path, rule.path);
        }
        assert_eq!(
            rule_for("/grpc.health.v1.Health/Check").unwrap().requirement,
            Requirement::Open
        );
        assert_eq!(
            rule_for("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo")
                .unwrap()
                .requirement,
            Requirement::Reflection
        );
        assert!(rule_for("/notify.v1.MessageService/DeleteEverything").is_none());
    }
}
