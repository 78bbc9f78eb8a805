/**
 * The element's stylesheet, adopted by its shadow root as a constructed
 * `CSSStyleSheet` (a page's CSP does not govern those, so no
 * `'unsafe-inline'` is needed). Every color, the radius and the font are
 * custom properties a page overrides; the dark set applies with
 * `theme="dark"`, or with `theme="auto"` when the system prefers dark.
 * Both sets keep text at 4.5:1 or more against its background.
 */

const DARK =
  "--notify-accent:#8ab4f8;--notify-bg:#1b1d21;--notify-fg:#e6e8eb;--notify-muted:#a3abb5;" +
  "--notify-border:#3a3f47;--notify-hover:#262a30;--notify-unread-bg:#1f2a3d;--notify-fresh-bg:#3d3520;" +
  "--notify-badge-bg:#f28b82;--notify-badge-fg:#1b1d21;--notify-shadow:0 8px 24px rgba(0,0,0,.6);color-scheme:dark;";

const CSS = `
:host{--notify-accent:#0b57d0;--notify-bg:#fff;--notify-fg:#1f2328;--notify-muted:#59636e;
--notify-border:#d0d7de;--notify-hover:#f3f5f8;--notify-unread-bg:#eef4ff;--notify-fresh-bg:#fff4ce;
--notify-badge-bg:#c5221f;--notify-badge-fg:#fff;--notify-radius:8px;
--notify-font:system-ui,-apple-system,"Segoe UI",Roboto,"PingFang SC","Microsoft YaHei","Noto Sans SC",sans-serif;
--notify-shadow:0 8px 24px rgba(0,0,0,.18);--notify-panel-width:380px;--notify-panel-height:480px;--notify-z-index:1000;
display:inline-block;position:relative;font:14px/1.4 var(--notify-font);color:var(--notify-fg);color-scheme:light}
:host([theme=dark]){${DARK}}
@media (prefers-color-scheme:dark){:host([theme=auto]){${DARK}}}
[hidden]{display:none!important}
*{box-sizing:border-box}
button{font:inherit;color:inherit;background:none;border:0;padding:0;cursor:pointer}
:focus-visible{outline:2px solid var(--notify-accent);outline-offset:2px}
svg{width:20px;height:20px;fill:currentColor;display:block}
.sr{position:absolute;width:1px;height:1px;margin:-1px;padding:0;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap;border:0}
.bell{position:relative;display:grid;place-items:center;width:40px;height:40px;border-radius:50%;color:var(--notify-fg)}
.bell:hover{background:var(--notify-hover)}
.bell svg{width:24px;height:24px}
.badge{position:absolute;top:2px;right:0;min-width:18px;height:18px;padding:0 5px;border-radius:9px;font-size:11px;font-weight:700;
line-height:18px;text-align:center;background:var(--notify-badge-bg);color:var(--notify-badge-fg)}
.panel{position:absolute;top:calc(100% + 6px);right:0;z-index:var(--notify-z-index);width:min(var(--notify-panel-width),calc(100vw - 16px));
max-height:var(--notify-panel-height);display:flex;flex-direction:column;background:var(--notify-bg);color:var(--notify-fg);
border:1px solid var(--notify-border);border-radius:var(--notify-radius);box-shadow:var(--notify-shadow);overflow:hidden}
.header{display:flex;align-items:center;gap:8px;padding:10px 12px;border-bottom:1px solid var(--notify-border)}
h2{margin:0;font-size:15px;font-weight:600}
.status{display:flex;align-items:center;gap:4px;font-size:12px;color:var(--notify-muted);margin-right:auto}
.status::before{content:"";width:8px;height:8px;border-radius:50%;background:var(--notify-muted)}
.status[data-status=live]::before{background:#1e8e3e}
.status[data-status=live] span{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0)}
.text-button{color:var(--notify-accent);font-size:13px;padding:4px 6px;border-radius:4px}
.text-button:hover,.icon-button:hover{background:var(--notify-hover)}
.icon-button{display:grid;place-items:center;width:32px;height:32px;border-radius:50%;color:var(--notify-muted)}
.icon-button[aria-pressed=true]{color:var(--notify-accent)}
[role=tablist]{display:flex;border-bottom:1px solid var(--notify-border)}
[role=tab]{flex:1;padding:8px;color:var(--notify-muted);border-bottom:2px solid transparent;margin-bottom:-1px}
[role=tab][aria-selected=true]{color:var(--notify-accent);border-bottom-color:var(--notify-accent);font-weight:600}
[role=tab]:focus-visible,.item:focus-visible{outline-offset:-2px}
.scroll{overflow-y:auto;flex:1;min-height:120px}
ul{list-style:none;margin:0;padding:0}
.item{position:relative;display:flex;gap:10px;padding:10px 12px;border-bottom:1px solid var(--notify-border);cursor:pointer}
.item:hover{background:var(--notify-hover)}
.item[data-read=false]{background:var(--notify-unread-bg)}
.item.fresh{animation:notify-fresh 2.4s ease-out}
@keyframes notify-fresh{0%,40%{background:var(--notify-fresh-bg)}}
.dot{flex:none;width:8px;height:8px;margin-top:6px;border-radius:50%}
.item[data-read=false] .dot{background:var(--notify-accent)}
.content{flex:1;min-width:0}
.title{margin:0;font-weight:600;overflow-wrap:anywhere}
.body{margin:2px 0 0;color:var(--notify-fg);overflow-wrap:anywhere;display:-webkit-box;-webkit-line-clamp:3;-webkit-box-orient:vertical;overflow:hidden}
time{display:block;margin-top:4px;font-size:12px;color:var(--notify-muted)}
.actions{display:flex;align-items:flex-start;gap:2px}
.actions .icon-button{width:28px;height:28px}
.actions svg{width:18px;height:18px}
.note{padding:24px 16px;text-align:center;color:var(--notify-muted)}
.note button{margin-top:8px}
.more{padding:8px;text-align:center;font-size:12px;color:var(--notify-muted);min-height:8px}
.prefs{padding:12px;overflow-y:auto}
.prefs h3{margin:0 0 4px;font-size:14px}
.prefs p{margin:0 0 8px;color:var(--notify-muted);font-size:13px}
label{display:flex;align-items:center;gap:8px;padding:6px 0}
input{accent-color:var(--notify-accent);width:16px;height:16px;margin:0}
@media (prefers-reduced-motion:reduce){.item.fresh{animation:none}}
`;

let sheet: CSSStyleSheet | null = null;

/** The stylesheet, built once and shared by every element on the page. */
export function styles(): CSSStyleSheet {
  if (!sheet) {
    sheet = new CSSStyleSheet();
    sheet.replaceSync(CSS.replace(/\n/g, ""));
  }
  return sheet;
}
