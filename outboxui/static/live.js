// outboxui live.js: refreshes the page's live regions in place.
// It fetches the page's own URL with live=1 (the server renders only the
// [data-live] regions) every data-refresh milliseconds and swaps each
// region for its new copy, so the filter (the URL), the scroll position and
// anything typed in a form outside the regions are kept. A region holding
// the keyboard focus is left alone until the focus leaves it, so is one
// with events ticked (an action's selection: it would be lost), and one
// whose content is unchanged is not touched. A region's content is
// swapped inside the element, which stays, so that a screen reader
// announces a region marked aria-live when it changes. Without this
// script the pages are plain links and forms that say when they were
// rendered.
(function () {
  "use strict";
  var every = parseInt(document.body.getAttribute("data-refresh"), 10);
  var stamp = document.getElementById("updated");
  if (!(every > 0) || !stamp || !window.fetch || !window.DOMParser) {
    return;
  }
  var how = document.getElementById("updated-how");
  if (how) {
    how.textContent = "(refreshes every " + Math.round(every / 1000 * 10) / 10 + "s)";
  }
  // sig is a region's content without its title attributes (relative
  // ages such as "3s ago" that change on every render): a region whose
  // sig is unchanged is left alone, so a text selection, a hover or a
  // click on it survives the refresh.
  function sig(el) {
    var c = el.cloneNode(true);
    var titled = c.querySelectorAll("[title]");
    for (var i = 0; i < titled.length; i++) {
      titled[i].removeAttribute("title");
    }
    return c.outerHTML;
  }

  var last = Date.now();
  var failed = "";
  var busy = false;

  function ticked(el) {
    return !!el.querySelector("input[type=checkbox]:checked");
  }

  function tick() {
    var s = Math.floor((Date.now() - last) / 1000);
    var paused = false;
    var regions = document.querySelectorAll("[data-live]");
    for (var i = 0; i < regions.length; i++) {
      paused = paused || ticked(regions[i]);
    }
    stamp.textContent = (failed ? "update failed (" + failed + "); last updated " : "updated ") + s + "s ago" +
      (paused ? "; the table is held while events are ticked" : "");
  }

  function refresh() {
    if (busy || document.hidden) {
      return;
    }
    busy = true;
    var u = new URL(window.location.href);
    u.searchParams.set("live", "1");
    window.fetch(u.toString(), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var regions = document.querySelectorAll("[data-live]");
        for (var i = 0; i < regions.length; i++) {
          var old = regions[i];
          var fresh = doc.getElementById(old.id);
          if (!fresh || old.contains(document.activeElement) || ticked(old) || sig(fresh) === sig(old)) {
            continue;
          }
          var copy = document.importNode(fresh, true);
          old.replaceChildren.apply(old, Array.prototype.slice.call(copy.childNodes));
        }
        last = Date.now();
        failed = "";
        document.body.setAttribute("data-updated", String(last));
        tick();
      })
      .catch(function (err) {
        failed = String(err && err.message || err);
        tick();
      })
      .then(function () {
        busy = false;
      });
  }

  tick();
  window.setInterval(tick, 1000);
  window.setInterval(refresh, every);
  document.addEventListener("visibilitychange", function () {
    if (!document.hidden) {
      refresh();
    }
  });
})();
