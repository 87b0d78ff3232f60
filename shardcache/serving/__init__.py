"""The HTTP side of the daemon (the target house of `server`, `middleware`, `admin`, `body`,
`ranges`, `access` and `connections`, which still sit at the package root).

    status_page        `GET /_/`: the status page's handler and its security headers
    status_page_html   the page itself: HTML, CSS and JS as strings, no external asset
    targets            the (origin, key) pairs a `POST /_/prefetch` or `/_/plans` body names,
                       bounded before they are expanded (request parsing, pure)

It must not know how the cache, the origins or the daemon work: the page reads only the
`/_/status` document, as any other client does, and `targets` only the body and the origins'
names.
"""
