"""Who may use the studio: users, their roles, API keys and gallery logins (`mas users`), and the lookup
that turns a credential into an `Identity` (`mas.domain.identity`)."""
