"""The web page over the sessions (`ollie srv start --web`, `ollie web`): see docs/web.md.

It is a frontend of the file server: it runs on the server's event loop, reads what the files of
the namespace show and changes sessions by writing those files (`s/<id>/prompt`, `s/<id>/ctl`,
`ctl`, `b/new`, …), so it gets the same answers and the same refusals a script gets. The page is
fed live by the sessions' own events (the ones their chat and `statewait` come from) over a
WebSocket (the same streams are served as server-sent events, for scripts): nothing polls.

    app.py     the ASGI app (starlette): the checks every request passes, the routes
    feed.py    the events, coalesced, for each open page
    static/    the page itself: one HTML file, one script, one style sheet (no build step)
"""
