// The development example: <notify-inbox> for the user named by ?user=
// (42), with a token from the edge's development endpoint, in the
// language (?lang=) and theme (?theme=) asked for. No inline script or
// style: the page runs under a strict Content-Security-Policy.
import { NotifyError } from "/v1/sdk/notify-inbox.js";

const params = new URLSearchParams(location.search);
const userId = params.get("user") || "42";
const lang = params.get("lang") || "en";
const theme = params.get("theme") || "light";

document.documentElement.lang = lang;
document.documentElement.dataset.theme = theme;
document.getElementById("who").textContent = `user ${userId}`;

/** The token provider: the edge's development endpoint stands in for an app's backend. */
async function getToken() {
  const response = await fetch("/dev/token", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ user_id: userId }),
  });
  if (!response.ok) throw new NotifyError(response.status, "token_provider", `POST /dev/token answered ${response.status}`);
  const { token } = await response.json();
  return token;
}

const log = document.getElementById("log");
function note(text) {
  const entry = document.createElement("li");
  entry.textContent = `${new Date().toLocaleTimeString()} ${text}`;
  log.prepend(entry);
  while (log.children.length > 50) log.lastElementChild.remove();
}

const inbox = document.getElementById("inbox");
inbox.setAttribute("lang", lang);
inbox.setAttribute("theme", theme);
inbox.addEventListener("notify:ready", () => note("ready"));
inbox.addEventListener("notify:badge", (event) => note(`badge: ${JSON.stringify(event.detail)}`));
inbox.addEventListener("notify:error", (event) => note(`error: ${event.detail.code}: ${event.detail.message}`));
inbox.addEventListener("notify:item-click", (event) => note(`clicked: ${event.detail.item.title}`));
inbox.getToken = getToken;
