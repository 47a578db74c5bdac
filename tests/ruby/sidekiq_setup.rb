# Settings every Ruby Sidekiq server of the tests takes (6.4.1, 7.3 or 8.0),
# loaded by the job files (jobs.rb, fleet_jobs.rb).
require 'sidekiq'

# Sidekiq 7+ speaks redis-client: no Redis constant to configure.
Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)
# The tests wait for scheduled jobs and retries: poll every second, and
# with the average set explicitly Sidekiq also skips its initial wait. 7.0
# moved the options from Sidekiq.options to the default configuration.
if Sidekiq.respond_to?(:default_configuration)
  Sidekiq.default_configuration[:poll_interval_average] = 1
else
  Sidekiq.options[:poll_interval_average] = 1
end
