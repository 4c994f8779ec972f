// The live numbers: one stream per browser, shared by every tab of the dashboard.
// A browser allows six HTTP/1.1 connections per host, and each server-sent-events
// stream holds one for as long as its page is open: with one stream per tab, the
// seventh tab stayed blank. So the tabs elect one (a Web Lock, released when its
// tab closes, when the next waiting tab takes over) to hold the stream, and it
// passes each fragment to the others over a BroadcastChannel. Without those APIs
// each tab holds its own stream, as before.
//
// A page that wants the numbers has an element with data-live="<stream URL>".
// Each fragment (the overview's #live section, rendered the same for everyone)
// replaces the page's #live section when it has one, and fires "outbox-live" on
// the body, which the lists' status tabs reload on (hx-trigger).
(function () {
  var feed = document.querySelector("[data-live]");
  if (!feed) return;
  var url = feed.getAttribute("data-live");
  var deliver = function (html) {
    var live = document.getElementById("live");
    if (live && feed.contains(live)) {
      var t = document.createElement("template");
      t.innerHTML = html;
      var fresh = t.content.firstElementChild;
      if (fresh) {
        live.replaceWith(fresh);
        if (window.htmx) window.htmx.process(fresh);
      }
    }
    document.body.dispatchEvent(new CustomEvent("outbox-live"));
  };
  // A stream that gives up for good (closed: no session any more, answered
  // 204; a proxy's error) is opened again after a pause, as htmx's extension
  // did; `onClosed` runs when it gives up.
  var stream = function (onFragment, onClosed) {
    var source = new EventSource(url);
    source.addEventListener("live", function (e) { onFragment(e.data); });
    source.addEventListener("error", function () {
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        onClosed();
      }
    });
  };
  var pause = function () { return 2000 + Math.random() * 3000; };
  if (!("BroadcastChannel" in window) || !navigator.locks) {
    var alone = function () {
      stream(deliver, function () { setTimeout(alone, pause()); });
    };
    alone();
    return;
  }
  var name = "outbox-live " + new URL(url, location.href).href;
  var channel = new BroadcastChannel(name);
  channel.onmessage = function (m) { deliver(m.data); };
  var lead = function () {
    navigator.locks.request(name, function () {
      // This tab leads while its stream lives: the lock is held as long as
      // this promise is pending. A stream that gives up hands the lead on
      // (another tab, or this one again after a pause).
      feed.setAttribute("data-live-leader", "");
      return new Promise(function (handOn) {
        stream(function (html) {
          deliver(html);
          channel.postMessage(html);
        }, function () {
          feed.removeAttribute("data-live-leader");
          handOn();
        });
      });
    }).then(function () { setTimeout(lead, pause()); });
  };
  lead();
})();
