// The Notify console's one script (a module; the Content-Security-Policy
// allows no other). Pages work without it; it adds the confirmations of the
// buttons and the live view of a send's page.

const number = new Intl.NumberFormat("en-US");

// Every button that changes something asks first, naming the send and its
// recipients (the text comes from the server).
for (const form of document.querySelectorAll("form[data-confirm]")) {
  form.addEventListener("submit", (event) => {
    if (!window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
}

const send = document.querySelector("article.send[data-live]");
if (send) {
  followSend(send);
}

// A send's page: one EventSource on /console/sends/{id}/live, closed while
// the tab is hidden or updates are paused, and for good once the send is
// final (the page is then reloaded to show its final record).
function followSend(page) {
  const url = page.dataset.live;
  const renderedStatus = page.dataset.status;
  // When the server began reading what this page shows (Unix ms): an
  // update read before it is older than the page (the poller's last value,
  // say, from before the button press that rendered it) and is skipped.
  const renderedAt = Number(page.dataset.renderedAt || 0);
  const state = document.getElementById("live-state");
  const toggle = document.getElementById("live-toggle");
  const updatedAt = document.getElementById("updated-at");
  const chart = startChart(document.getElementById("chart"));
  let source = null;
  let held = false;
  let finished = false;
  let previous = null;

  const show = (text, quiet) => {
    state.textContent = text;
    state.classList.toggle("held", quiet);
  };

  const open = () => {
    if (source || held || finished || document.hidden) {
      return;
    }
    source = new EventSource(url);
    source.addEventListener("progress", (event) => apply(JSON.parse(event.data)));
    source.addEventListener("open", () => show("live", false));
    source.addEventListener("error", () => {
      if (!finished) {
        show("reconnecting", true);
      }
    });
  };

  const close = () => {
    if (source) {
      source.close();
      source = null;
    }
  };

  const apply = (update) => {
    if (update.at_ms < renderedAt) {
      return;
    }
    const total = update.total;
    for (const [name, value] of Object.entries(total)) {
      setText(page.querySelector(`[data-counter="${name}"]`), number.format(value));
    }
    const done = total.delivered + total.failed + total.suppressed + total.cancelled;
    setText(page.querySelector('[data-counter="done_percent"]'), percent(done, total.total));
    setText(page.querySelector('[data-counter="read_percent"]'), percent(total.read, total.delivered));
    setBar(page.querySelector("section.progress svg.bar"), total);
    for (const shard of update.shards) {
      const row = page.querySelector(`tr[data-shard="${shard.shard}"]`);
      if (row) {
        setBar(row.querySelector("svg.bar"), shard);
        setText(row.querySelector('[data-shard-counter="delivered"]'), number.format(shard.delivered));
        setText(row.querySelector('[data-shard-counter="total"]'), number.format(shard.total));
      }
    }
    if (previous && update.at_ms > previous.at_ms) {
      const seconds = (update.at_ms - previous.at_ms) / 1000;
      chart.add(
        update.at_ms / 1000,
        Math.max(0, total.delivered - previous.total.delivered) / seconds,
        Math.max(0, total.read - previous.total.read) / seconds,
      );
    }
    previous = update;
    updatedAt.textContent = `updated ${new Date(update.at_ms).toLocaleTimeString()}`;
    if (update.finished || update.status !== renderedStatus) {
      // Paused, resumed, completed, cancelled: the server renders the
      // buttons, the banner and the timeline that go with it.
      finished = update.finished;
      close();
      show(update.finished ? "final" : "changed", true);
      window.location.reload();
    }
  };

  // A button pressed: its answer is the next page; no update may reload
  // this one meanwhile (that would abandon the request).
  document.addEventListener("submit", (event) => {
    if (!event.defaultPrevented) {
      finished = true;
      close();
    }
  });

  toggle.addEventListener("click", () => {
    held = !held;
    toggle.textContent = held ? "Resume updates" : "Pause updates";
    if (held) {
      close();
      show("updates paused", true);
    } else {
      open();
    }
  });

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      close();
    } else {
      open();
    }
  });

  open();
}

function setText(element, text) {
  if (element && element.textContent !== text) {
    element.textContent = text;
  }
}

function percent(part, whole) {
  return whole === 0 ? "0" : ((part * 100) / whole).toFixed(1);
}

// The stacked bar: attributes only (the policy refuses inline styles, not
// SVG geometry).
function setBar(svg, counters) {
  if (!svg) {
    return;
  }
  let x = 0;
  for (const part of ["delivered", "failed", "suppressed", "cancelled"]) {
    const rect = svg.querySelector(`[data-part="${part}"]`);
    const width = counters.total === 0 ? 0 : Math.min(100, (counters[part] * 100) / counters.total);
    rect.setAttribute("x", x.toFixed(2));
    rect.setAttribute("width", width.toFixed(2));
    x += width;
  }
}

// Delivered and read per second since the page opened (uPlot, vendored and
// served by the api; loaded only on a send's page).
function startChart(element) {
  const times = [];
  const delivered = [];
  const read = [];
  const keep = 900;
  let plot = null;
  import("./vendor/uplot/uPlot.esm.js").then(({ default: uPlot }) => {
    const options = {
      width: Math.max(320, element.clientWidth - 16),
      height: 220,
      series: [
        {},
        { label: "delivered/s", stroke: "#2e9d5b", width: 2, points: { show: false } },
        { label: "read/s", stroke: "#2457c5", width: 2, points: { show: false } },
      ],
      axes: [{}, { size: 60 }],
    };
    plot = new uPlot(options, [times, delivered, read], element);
    new ResizeObserver(() => plot.setSize({ width: Math.max(320, element.clientWidth - 16), height: 220 })).observe(element);
  });
  return {
    add(at, deliveredRate, readRate) {
      times.push(at);
      delivered.push(deliveredRate);
      read.push(readRate);
      if (times.length > keep) {
        times.shift();
        delivered.shift();
        read.shift();
      }
      if (plot) {
        plot.setData([times, delivered, read]);
      }
    },
  };
}
