/**
 * `<notify-inbox>`: a bell with the unseen count and a panel with the
 * user's notifications, on a `NotifyStore`. Shadow DOM, styled by custom
 * properties and `::part`s, keyboard navigable, announced to screen
 * readers, in English or Simplified Chinese (or any strings the page
 * sets). Titles and bodies are set as text, never parsed.
 */
import { NotifyClient } from "../client.js";
import { asNotifyError } from "../errors.js";
import { NotifyStore, type ListFilter, type StoreState } from "../store.js";
import { format, stringsFor, type Strings } from "../strings.js";
import type { GetToken } from "../token.js";
import type { Badge, InboxItem, Preferences } from "../types.js";
import { h, icon } from "./dom.js";
import { restarts } from "./restart.js";
import { styles } from "./styles.js";
import { fullTime, relativeTime } from "./time.js";

/** The panel's tabs and the list each shows. */
const TABS = {
  inbox: { view: "inbox" },
  unread: { view: "inbox", unread_only: true },
  archive: { view: "archive" },
} satisfies Record<string, ListFilter>;

type Tab = keyof typeof TABS;
const TAB_NAMES = Object.keys(TABS) as Tab[];

/** Properties a page may set before the element is defined (they are re-applied through the setters). */
const UPGRADED = ["getToken", "client", "store", "strings", "categories"] as const;

/** Detail of `notify:item-click`. */
export interface ItemClickDetail {
  item: InboxItem;
}

/** The `<notify-inbox>` element. */
export class NotifyInboxElement extends HTMLElement {
  static readonly observedAttributes = ["lang", "categories", "edge-url", "page-size"];

  private readonly root: ShadowRoot;
  private readonly bell = h("button", { part: "bell", class: "bell", type: "button", "aria-expanded": "false", "aria-controls": "panel" });
  private readonly badge = h("span", { part: "badge", class: "badge", "aria-hidden": "true", hidden: true });
  private readonly panel = h("div", { part: "panel", class: "panel", id: "panel", role: "dialog", "aria-labelledby": "heading", hidden: true });
  private readonly heading = h("h2", { part: "heading", id: "heading" });
  private readonly status = h("div", { part: "status", class: "status", "data-status": "connecting" });
  private readonly markAll = h("button", { part: "mark-all-read", class: "text-button", type: "button" });
  private readonly prefsToggle = h("button", { part: "preferences-toggle", class: "icon-button", type: "button", "aria-pressed": "false" }, icon("settings"));
  private readonly tablist = h("div", { part: "tabs", role: "tablist" });
  private readonly tabs = new Map<Tab, HTMLButtonElement>();
  private readonly listPanel = h("div", { part: "list-panel", class: "scroll", role: "tabpanel", id: "list-panel", tabindex: "-1" });
  private readonly list = h("ul", { part: "list", role: "list" });
  private readonly more = h("div", { part: "more", class: "more", hidden: true });
  private readonly empty = h("div", { part: "empty", class: "note", hidden: true });
  private readonly errorText = h("p", {});
  private readonly retry = h("button", { part: "retry", class: "text-button", type: "button" });
  private readonly error = h("div", { part: "error", class: "note", role: "alert", hidden: true }, this.errorText, this.retry);
  private readonly prefs = h("section", { part: "preferences", class: "prefs scroll", hidden: true });
  private readonly live = h("div", { part: "live-region", class: "sr", role: "status", "aria-live": "polite", "aria-atomic": "true" });

  private tokenProvider: GetToken | null = null;
  private givenClient: NotifyClient | null = null;
  private givenStore: NotifyStore | null = null;
  /** The store in use: the given one, or one the element made (and stops when removed). */
  private active: NotifyStore | null = null;
  private owned = false;
  private unsubscribe: (() => void)[] = [];
  private custom: Partial<Strings> = {};
  private extraCategories: string[] = [];
  private tab: Tab = "inbox";
  private readonly itemElements = new Map<string, HTMLLIElement>();
  private readonly fresh = new Set<string>();
  /** The timers of announcements under way (cleared when the element leaves the page). */
  private readonly announceTimers = new Set<ReturnType<typeof setTimeout>>();
  private state: StoreState | null = null;
  private ready = false;
  private preferences: Preferences | null = null;
  private observer: IntersectionObserver | null = null;
  private clock: ReturnType<typeof setInterval> | null = null;
  private readonly outside = (event: Event) => {
    if (!event.composedPath().includes(this)) this.close(false);
  };

  constructor() {
    super();
    this.root = this.attachShadow({ mode: "open" });
    this.root.adoptedStyleSheets = [styles()];
    this.bell.append(icon("bell"), this.badge);
    for (const tab of TAB_NAMES) {
      const button = h("button", { part: "tab", role: "tab", type: "button", id: `tab-${tab}`, "data-view": tab, "aria-controls": "list-panel" });
      button.addEventListener("click", () => this.selectTab(tab));
      this.tabs.set(tab, button);
      this.tablist.append(button);
    }
    this.listPanel.append(this.list, this.more, this.empty, this.error);
    this.panel.append(h("div", { part: "header", class: "header" }, this.heading, this.status, this.markAll, this.prefsToggle), this.tablist, this.listPanel, this.prefs);
    this.root.append(this.bell, this.panel, this.live);

    this.bell.addEventListener("click", () => (this.panel.hidden ? this.open() : this.close(true)));
    this.markAll.addEventListener("click", () => this.act((store) => store.markAllRead()));
    this.prefsToggle.addEventListener("click", () => this.showPreferences(this.prefs.hidden));
    this.retry.addEventListener("click", () => void this.active?.reload());
    this.tablist.addEventListener("keydown", (event) => this.onTabKey(event));
    this.list.addEventListener("click", (event) => this.onListClick(event));
    this.list.addEventListener("keydown", (event) => this.onListKey(event));
    this.root.addEventListener("keydown", (event) => {
      if ((event as KeyboardEvent).key === "Escape" && !this.panel.hidden) {
        event.stopPropagation();
        this.close(true);
      }
    });
    this.renderStrings();
  }

  /**
   * The app's token provider; setting one connects with a client and store
   * of the element's own. Another provider replacing it is called from the
   * next token on, without reconnecting (the same user's, as a framework's
   * re-render passes); for another user, set null first.
   */
  get getToken(): GetToken | null {
    return this.tokenProvider;
  }
  set getToken(provider: GetToken | null) {
    const old = this.tokenProvider;
    this.tokenProvider = provider;
    if (restarts("getToken", old, provider)) this.restart();
  }

  /** A client to use instead of a token provider (the element makes the store). */
  get client(): NotifyClient | null {
    return this.givenClient ?? this.active?.client ?? null;
  }
  set client(client: NotifyClient | null) {
    const old = this.givenClient;
    this.givenClient = client;
    if (restarts("client", old, client)) this.restart();
  }

  /** The live store in use. Set one to share it with the page: the element starts it and follows its list, and never stops it. */
  get store(): NotifyStore | null {
    return this.active ?? this.givenStore;
  }
  set store(store: NotifyStore | null) {
    const old = this.givenStore;
    this.givenStore = store;
    if (restarts("store", old, store)) this.restart();
  }

  /** Strings over the language's set. */
  get strings(): Strings {
    return { ...stringsFor(this.language()), ...this.custom };
  }
  set strings(strings: Partial<Strings>) {
    this.custom = strings ?? {};
    this.renderStrings();
  }

  /** Categories offered in the settings besides those of the items and the muted ones (also the `categories` attribute, comma-separated). */
  get categories(): string[] {
    return [...this.extraCategories];
  }
  set categories(categories: string[]) {
    this.extraCategories = [...(categories ?? [])];
    if (!this.prefs.hidden) this.renderPreferences();
  }

  connectedCallback(): void {
    for (const name of UPGRADED) {
      if (Object.prototype.hasOwnProperty.call(this, name)) {
        const self = this as unknown as Record<string, unknown>;
        const value = self[name];
        delete self[name];
        self[name] = value;
      }
    }
    this.attach();
  }

  disconnectedCallback(): void {
    this.close(false);
    this.detach();
    for (const timer of this.announceTimers) clearTimeout(timer);
    this.announceTimers.clear();
    this.fresh.clear();
  }

  attributeChangedCallback(name: string, old: string | null, value: string | null): void {
    if (old === value) return;
    if (name === "lang") this.renderStrings();
    else if (name === "categories") this.categories = (value ?? "").split(",").map((c) => c.trim()).filter(Boolean);
    else if (this.owned) this.restart();
  }

  /** Opens the panel, marks everything seen, and focuses the selected tab. */
  open(): void {
    if (!this.panel.hidden) return;
    this.panel.hidden = false;
    this.bell.setAttribute("aria-expanded", "true");
    document.addEventListener("pointerdown", this.outside, true);
    this.clock = setInterval(() => this.state && this.renderList(this.state), 60_000);
    if (this.state) this.renderList(this.state);
    if (this.state?.badge?.unseen) this.act((store) => store.markAllSeen());
    this.tabs.get(this.tab)?.focus();
  }

  /** Closes the panel, and the settings view (the next open shows the list and focuses its tab); `focusBell` returns the focus to the bell (as Escape does). */
  close(focusBell = false): void {
    if (this.panel.hidden) return;
    this.showPreferences(false);
    this.panel.hidden = true;
    this.bell.setAttribute("aria-expanded", "false");
    document.removeEventListener("pointerdown", this.outside, true);
    if (this.clock !== null) clearInterval(this.clock);
    this.clock = null;
    if (focusBell) this.bell.focus();
  }

  private language(): string {
    return this.getAttribute("lang") || document.documentElement.lang || navigator.language || "en";
  }

  private restart(): void {
    this.detach();
    this.attach();
  }

  private attach(): void {
    if (!this.isConnected || this.active) return;
    let store = this.givenStore;
    if (!store) {
      const client =
        this.givenClient ??
        (this.tokenProvider &&
          // Through the property, so that a new provider set later is the one called.
          new NotifyClient({ edgeUrl: this.getAttribute("edge-url") || location.origin, getToken: () => this.tokenProvider!() }));
      if (!client) return;
      const pageSize = Number(this.getAttribute("page-size")) || undefined;
      store = new NotifyStore({ client, pageSize, filter: TABS[this.tab] });
      this.owned = true;
    }
    this.active = store;
    const filter = TABS[this.tab];
    if (!this.owned && JSON.stringify(store.getState().filter) !== JSON.stringify(filter)) void store.setFilter(filter);
    this.unsubscribe = [
      store.subscribe((state) => this.render(state)),
      store.onDelivered((item) => this.announce(item)),
    ];
    if (typeof IntersectionObserver === "function") {
      this.observer = new IntersectionObserver((entries) => {
        if (entries.some((entry) => entry.isIntersecting)) void this.active?.loadMore();
      }, { root: this.listPanel, rootMargin: "0px 0px 160px 0px" });
      this.observer.observe(this.more);
    }
    store.start();
  }

  private detach(): void {
    for (const stop of this.unsubscribe) stop();
    this.unsubscribe = [];
    this.observer?.disconnect();
    this.observer = null;
    if (this.owned) this.active?.stop();
    this.active = null;
    this.owned = false;
    this.state = null;
    this.ready = false;
  }

  private emit(name: string, detail: unknown, cancelable = false): boolean {
    return this.dispatchEvent(new CustomEvent(name, { detail, bubbles: true, composed: true, cancelable }));
  }

  /** Runs a store action, reporting its failure as `notify:error`. */
  private act(action: (store: NotifyStore) => Promise<unknown>): void {
    const store = this.active;
    if (store) action(store).catch((error: unknown) => this.emit("notify:error", asNotifyError(error, "network")));
  }

  private renderStrings(): void {
    const s = this.strings;
    this.heading.textContent = s.notifications;
    this.markAll.textContent = s.markAllRead;
    this.prefsToggle.setAttribute("aria-label", s.preferences);
    this.prefsToggle.title = s.preferences;
    this.retry.textContent = s.retry;
    this.errorText.textContent = s.loadError;
    const labels: Record<Tab, string> = { inbox: s.tabInbox, unread: s.tabUnread, archive: s.tabArchive };
    for (const [tab, button] of this.tabs) button.textContent = labels[tab];
    this.tablist.setAttribute("aria-label", s.notifications);
    this.renderTabs();
    if (this.state) this.render(this.state);
    else this.renderBadge(null);
    if (!this.prefs.hidden) this.renderPreferences();
  }

  private renderTabs(): void {
    for (const [tab, button] of this.tabs) {
      const selected = tab === this.tab;
      button.setAttribute("aria-selected", String(selected));
      button.tabIndex = selected ? 0 : -1;
    }
    this.listPanel.setAttribute("aria-labelledby", `tab-${this.tab}`);
  }

  private render(state: StoreState): void {
    const previous = this.state;
    this.state = state;
    this.renderBadge(state.badge);
    this.status.dataset.status = state.status;
    this.status.replaceChildren(h("span", {}, this.strings[state.status]));
    this.renderList(state);
    if (!this.ready && state.badge) {
      this.ready = true;
      this.emit("notify:ready", { store: this.active });
    }
    if (state.badge && state.badge !== previous?.badge) this.emit("notify:badge", state.badge);
    if (state.error && state.error !== previous?.error) this.emit("notify:error", state.error);
    // A page came in while the sentinel stayed in view: observing it again reports it again.
    if (previous?.loading && !state.loading && state.hasMore && this.observer) {
      this.observer.unobserve(this.more);
      this.observer.observe(this.more);
    }
  }

  private renderBadge(badge: Badge | null): void {
    const s = this.strings;
    const unseen = badge?.unseen ?? 0;
    this.badge.hidden = unseen === 0;
    this.badge.textContent = unseen === 0 ? "" : unseen > 99 ? "99+" : String(unseen);
    this.bell.setAttribute("aria-label", unseen ? format(s.bellUnseen, { count: unseen }) : s.notifications);
  }

  private renderList(state: StoreState): void {
    const s = this.strings;
    const now = Date.now();
    const lang = this.language();
    const focusedItem = this.root.activeElement?.closest("[part=item]") ?? null;
    const focusIndex = focusedItem ? Array.prototype.indexOf.call(this.list.children, focusedItem) : -1;
    const listed = new Set<string>();
    state.items.forEach((item, index) => {
      let element = this.itemElements.get(item.message_id);
      if (!element) {
        element = this.createItem(item.message_id);
        this.itemElements.set(item.message_id, element);
      }
      this.fillItem(element, item, s, now, lang);
      listed.add(item.message_id);
      const at = this.list.children[index];
      if (at !== element) this.list.insertBefore(element, at ?? null);
    });
    for (const [id, element] of this.itemElements) {
      if (listed.has(id)) continue;
      element.remove();
      this.itemElements.delete(id);
    }
    // The focused item left the list (archived, deleted, revoked): focus its neighbour, not the page.
    if (focusedItem && !focusedItem.isConnected) {
      const next = this.list.children[Math.min(focusIndex, this.list.children.length - 1)] as HTMLElement | undefined;
      (next ?? this.tabs.get(this.tab))?.focus();
    }
    const failed = state.listError !== null && state.items.length === 0;
    this.error.hidden = !failed;
    this.empty.hidden = failed || state.loading || state.items.length > 0;
    this.empty.textContent = { inbox: s.emptyInbox, unread: s.emptyUnread, archive: s.emptyArchive }[this.tab];
    this.more.hidden = !state.loading && !state.hasMore;
    this.more.textContent = state.loading ? s.loading : "";
    this.listPanel.setAttribute("aria-busy", String(state.loading));
  }

  private createItem(id: string): HTMLLIElement {
    const item = h(
      "li",
      { part: "item", class: "item", tabindex: "0", "data-message-id": id },
      h("span", { class: "dot", "aria-hidden": "true" }),
      h("div", { class: "content" }, h("span", { class: "sr" }), h("p", { part: "item-title", class: "title" }), h("p", { part: "item-body", class: "body" }), h("time", { part: "item-time" })),
      h("div", { class: "actions" }, h("button", { class: "icon-button", type: "button" }), h("button", { part: "item-delete", class: "icon-button", type: "button" }, icon("delete"))),
    );
    return item;
  }

  private fillItem(element: HTMLLIElement, item: InboxItem, s: Strings, now: number, lang: string): void {
    const [unread, title, body, time] = Array.from(element.querySelector(".content")!.children) as HTMLElement[];
    const [archive, remove] = Array.from(element.querySelector(".actions")!.children) as HTMLButtonElement[];
    element.dataset.read = String(item.read);
    element.classList.toggle("fresh", this.fresh.has(item.message_id));
    unread!.textContent = item.read ? "" : `${s.unread}: `;
    title!.textContent = item.title;
    body!.textContent = item.body;
    body!.hidden = !item.body;
    time!.setAttribute("datetime", item.created_at);
    time!.title = fullTime(item.created_at, lang);
    time!.textContent = relativeTime(item.created_at, now, lang);
    const unarchive = item.archived;
    if (archive!.dataset.action !== (unarchive ? "unarchive" : "archive")) {
      archive!.dataset.action = unarchive ? "unarchive" : "archive";
      archive!.setAttribute("part", unarchive ? "item-unarchive" : "item-archive");
      archive!.replaceChildren(icon(unarchive ? "unarchive" : "archive"));
    }
    const archiveLabel = unarchive ? s.unarchive : s.archive;
    archive!.setAttribute("aria-label", `${archiveLabel}: ${item.title}`);
    archive!.title = archiveLabel;
    remove!.setAttribute("aria-label", `${s.delete}: ${item.title}`);
    remove!.title = s.delete;
  }

  private itemOf(element: Element | null): InboxItem | undefined {
    const id = element?.closest<HTMLElement>("[data-message-id]")?.dataset.messageId;
    return this.state?.items.find((item) => item.message_id === id);
  }

  private onListClick(event: Event): void {
    const target = event.target as Element;
    const item = this.itemOf(target);
    if (!item) return;
    const button = target.closest("button");
    const ids = [item.message_id];
    if (button?.dataset.action === "archive") this.act((store) => store.archive(ids));
    else if (button?.dataset.action === "unarchive") this.act((store) => store.unarchive(ids));
    else if (button?.getAttribute("part") === "item-delete") this.act((store) => store.delete(ids));
    else if (!button) this.activate(item);
  }

  /** An item chosen: `notify:item-click`; unless a listener cancels it, the item is marked read and the panel closes. */
  private activate(item: InboxItem): void {
    if (!this.emit("notify:item-click", { item } satisfies ItemClickDetail, true)) return;
    if (!item.read) this.act((store) => store.markRead([item.message_id]));
    this.close(true);
  }

  private onListKey(event: KeyboardEvent): void {
    const target = event.target as HTMLElement;
    if (target.getAttribute("part") !== "item") return;
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      const item = this.itemOf(target);
      if (item) this.activate(item);
    } else if (event.key === "ArrowDown" || event.key === "ArrowUp") {
      event.preventDefault();
      const next = event.key === "ArrowDown" ? target.nextElementSibling : target.previousElementSibling;
      (next as HTMLElement | null)?.focus();
    }
  }

  private onTabKey(event: KeyboardEvent): void {
    const index = TAB_NAMES.indexOf(this.tab);
    const moves: Record<string, number> = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: TAB_NAMES.length - 1 };
    const to = moves[event.key];
    if (to === undefined) return;
    event.preventDefault();
    const tab = TAB_NAMES[(to + TAB_NAMES.length) % TAB_NAMES.length]!;
    this.selectTab(tab);
    this.tabs.get(tab)?.focus();
  }

  private selectTab(tab: Tab): void {
    this.showPreferences(false);
    if (tab === this.tab) return;
    this.tab = tab;
    this.renderTabs();
    void this.active?.setFilter(TABS[tab]);
  }

  /** A new item: highlighted for a moment, and announced politely. */
  private announce(item: InboxItem): void {
    this.fresh.add(item.message_id);
    this.later(() => {
      this.fresh.delete(item.message_id);
      this.itemElements.get(item.message_id)?.classList.remove("fresh");
    }, 2_400);
    if (this.state) this.renderList(this.state);
    this.live.textContent = "";
    this.later(() => (this.live.textContent = format(this.strings.newItem, { title: item.title })), 50);
  }

  /** `setTimeout`, remembered until it runs so that leaving the page cancels it. */
  private later(callback: () => void, ms: number): void {
    const timer = setTimeout(() => {
      this.announceTimers.delete(timer);
      callback();
    }, ms);
    this.announceTimers.add(timer);
  }

  private showPreferences(show: boolean): void {
    if (show === !this.prefs.hidden) return;
    this.prefs.hidden = !show;
    this.tablist.hidden = show;
    this.listPanel.hidden = show;
    this.prefsToggle.setAttribute("aria-pressed", String(show));
    if (!show) return;
    this.preferences = null;
    this.renderPreferences();
    const client = this.client;
    client?.getPreferences().then(
      (preferences) => {
        this.preferences = preferences;
        this.renderPreferences();
      },
      (error: unknown) => this.preferencesFailed(error),
    );
  }

  private preferencesFailed(error: unknown): void {
    this.emit("notify:error", asNotifyError(error, "network"));
    this.prefs.append(h("p", { part: "error", role: "alert" }, this.strings.preferencesError));
  }

  /** The settings: a checkbox per category (the items', the muted ones, the page's), checked when muted. */
  private renderPreferences(): void {
    const s = this.strings;
    const muted = new Set(this.preferences?.muted_categories ?? []);
    const categories = new Set([...this.extraCategories, ...muted]);
    for (const item of this.state?.items ?? []) if (item.category) categories.add(item.category);
    const boxes = [...categories].sort().map((category) => {
      const box = h("input", { type: "checkbox", disabled: !this.preferences, "data-category": category });
      box.checked = muted.has(category);
      box.addEventListener("change", () => this.setMuted(category, box));
      return h("label", { part: "preference" }, box, category);
    });
    this.prefs.replaceChildren(
      h("h3", {}, s.mutedCategories),
      h("p", {}, s.mutedHint),
      ...(boxes.length ? boxes : [h("p", {}, this.preferences ? s.noCategories : s.loading)]),
    );
  }

  private setMuted(category: string, box: HTMLInputElement): void {
    const client = this.client;
    const current = this.preferences;
    if (!client || !current) return;
    const muted = new Set(current.muted_categories ?? []);
    if (box.checked) muted.add(category);
    else muted.delete(category);
    // A PUT replaces every preference: the others (groups, locale) go back as read.
    client.setPreferences({ ...current, muted_categories: [...muted] }).then(
      (stored) => {
        this.preferences = stored;
        this.renderPreferences();
      },
      (error: unknown) => {
        box.checked = !box.checked;
        this.preferencesFailed(error);
      },
    );
  }
}

/** Defines `<notify-inbox>` unless the page already has. */
export function defineNotifyInbox(): void {
  if (typeof customElements !== "undefined" && !customElements.get("notify-inbox")) {
    customElements.define("notify-inbox", NotifyInboxElement);
  }
}
