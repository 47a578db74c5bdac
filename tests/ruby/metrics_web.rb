# Renders the Sidekiq 7.x or 8.1 Web UI's Metrics pages (GET /metrics and
# /metrics/CLASS) for the classes on the command line and prints, per
# page, its HTTP status and whether each class name appears in it.
require_relative 'web_mock'

Sidekiq.configure_client { |c| c.redis = { url: ENV.fetch('REDIS_URL') } }
req = sidekiq_web
res = req.get('/metrics')
puts "metrics #{res.status} #{ARGV.map { |k| "#{k}=#{res.body.include?(k)}" }.join(' ')}"
ARGV.each do |k|
  r = req.get("/metrics/#{k}")
  puts "metrics/#{k} #{r.status} #{r.body.include?(k)}"
end
